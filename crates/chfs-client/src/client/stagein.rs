//! Stage-in: the one rule of what a path given to `chstagein` or
//! `chfs stagein` stands for (see [`Client::stagein`]).

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use chfs_proto::path::{self, normalize};
use chfs_sys::lock;

use super::Client;
use crate::error::{fail, Error, Result};

/// Bytes read from a local file per write into the pool (the original's
/// stage-in buffer size).
const COPY_BUF: usize = 1 << 20;

/// Where [`Client::stagein`] takes a path from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageSource {
    /// A file, directory or symbolic link of the local file system, copied
    /// into the pool at `dst`.
    Local {
        /// The local path, as given.
        src: PathBuf,
        /// The path in the pool.
        dst: String,
        /// A directory with everything below it (`true`, what
        /// [`Client::stagein_source`] gives), or the directory alone (for a
        /// caller that shares its contents out, e.g. among MPI ranks).
        whole: bool,
    },
    /// A path of the pool, fetched by its servers from their backend
    /// ([`Client::fetch_from_backend`]).
    Backend(String),
}

fn io_err(what: &Path, e: std::io::Error) -> Error {
    Error::new(
        chfs_proto::error::io_errno(&e),
        format!("{}: {e}", what.display()),
    )
    .with_source(e)
}

impl Client {
    /// Stages `path` in; returns the bytes staged. The rule (`chstagein`
    /// and `chfs stagein` use it; the C API's `chfs_stagein()` would call
    /// [`Client::stagein_under`] with `CHFS_SUBDIR_PATH`):
    ///
    /// 1. `path` names an entry of the local file system (`lstat`, relative
    ///    paths from the working directory):
    ///    - inside the pool's backend directory (cache mode; as the servers
    ///      report it, resolved on this host): the servers fetch the same
    ///      path of the pool (the backend directory is the pool's root)
    ///      from the backend, every chunk by its owner — the original's
    ///      `cd BACKEND; find . | xargs chstagein`; nothing is written back;
    ///    - anywhere else: copied into the pool at `path` (a relative path
    ///      from the root: `in/a` is `/in/a`): a regular file's data, a
    ///      directory with everything below it, a symbolic link as a link;
    ///      missing parent directories are created, an existing file is
    ///      overwritten. In cache mode the copy is a new file, written back
    ///      like any other.
    /// 2. Otherwise `path` is a path of the pool, fetched from the backend
    ///    ([`Client::fetch_from_backend`]); in neither place: `ENOENT`.
    pub fn stagein(&self, path: &str) -> Result<u64> {
        self.stagein_under(path, "/")
    }

    /// [`Client::stagein`] with the destination of local copies, and the
    /// pool path of case 2, below the pool directory `under` (the C API's
    /// `CHFS_SUBDIR_PATH`).
    pub fn stagein_under(&self, path: &str, under: &str) -> Result<u64> {
        self.stage(&self.stagein_source(path, under)?)
    }

    /// Stages in what [`Client::stagein_source`] resolved; returns the
    /// bytes staged.
    pub fn stage(&self, source: &StageSource) -> Result<u64> {
        match source {
            StageSource::Backend(p) => self.fetch_from_backend(p).map_err(|e| {
                if e.errno() != libc::ENOENT {
                    return e;
                }
                let backend = match self.backend_dir() {
                    Ok(Some(b)) => format!("nor in the backend {}", b.display()),
                    _ => "and the pool has no backend to stage it in from".into(),
                };
                Error::new(
                    libc::ENOENT,
                    format!("{p}: no such local file, not in the pool {backend}"),
                )
            }),
            StageSource::Local { src, dst, whole } => self.copy_in(src, dst, *whole),
        }
    }

    /// Which case of [`Client::stagein`]'s rule `path` falls in.
    pub fn stagein_source(&self, path: &str, under: &str) -> Result<StageSource> {
        let in_pool = || normalize(&format!("{under}/{path}"));
        let src = Path::new(path);
        match std::fs::symlink_metadata(src) {
            Ok(_) => {
                if let Some(p) = self.backend_path_of(src)? {
                    return Ok(StageSource::Backend(p));
                }
                Ok(StageSource::Local {
                    src: src.to_path_buf(),
                    dst: in_pool()?,
                    whole: true,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(StageSource::Backend(in_pool()?))
            }
            Err(e) => Err(io_err(src, e)),
        }
    }

    /// The pool's backend directory as this host sees it (`None`: no
    /// backend, or not reachable under the servers' path here). Asked once
    /// per client.
    fn backend_dir(&self) -> Result<Option<PathBuf>> {
        let mut g = lock(&self.inner.backend_dir);
        if let Some(b) = &*g {
            return Ok(b.clone());
        }
        let mut last = None;
        let mut found = None;
        for (_, r) in self.server_status() {
            match r {
                Ok(s) => {
                    found = Some(s.backend);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(b) = found else {
            return Err(last.unwrap_or_else(|| Error::new(libc::ENOTCONN, "no server")));
        };
        let dir = (!b.is_empty())
            .then(|| std::fs::canonicalize(&b).ok())
            .flatten();
        *g = Some(dir.clone());
        Ok(dir)
    }

    /// The pool path of a local entry lying inside the backend directory.
    fn backend_path_of(&self, local: &Path) -> Result<Option<String>> {
        let Some(backend) = self.backend_dir()? else {
            return Ok(None);
        };
        // The entry itself is not followed (a link is staged as a link);
        // its directory is resolved.
        let full = match (local.parent(), local.file_name()) {
            (Some(dir), Some(name)) => {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                std::fs::canonicalize(dir)
                    .map_err(|e| io_err(dir, e))?
                    .join(name)
            }
            _ => std::fs::canonicalize(local).map_err(|e| io_err(local, e))?,
        };
        let Ok(rel) = full.strip_prefix(&backend) else {
            return Ok(None);
        };
        let rel = rel.to_str().ok_or_else(|| {
            Error::new(
                libc::EINVAL,
                format!("{}: not a UTF-8 path", local.display()),
            )
        })?;
        Ok(Some(normalize(&format!("/{rel}"))?))
    }

    /// Copies the local entry `src` into the pool at `dst` (a directory
    /// with its contents if `whole`).
    fn copy_in(&self, src: &Path, dst: &str, whole: bool) -> Result<u64> {
        let mut parents = Vec::new();
        let mut d = path::parent(dst);
        while d != "/" {
            match self.stat(d) {
                Ok(_) => break,
                Err(e) if e.errno() == libc::ENOENT => parents.push(d.to_string()),
                Err(e) => return Err(e),
            }
            d = path::parent(d);
        }
        for p in parents.iter().rev() {
            match self.mkdir(p, 0o755) {
                Err(e) if e.errno() != libc::EEXIST => return Err(e),
                _ => {}
            }
        }
        self.copy_entry(src, dst, whole)
    }

    fn copy_entry(&self, src: &Path, dst: &str, whole: bool) -> Result<u64> {
        let md = std::fs::symlink_metadata(src).map_err(|e| io_err(src, e))?;
        let mode = md.permissions().mode() & 0o7777;
        let ft = md.file_type();
        if ft.is_dir() {
            // Readable and writable by its owner, as the original makes it;
            // an existing directory gets the mode too (its creator may have
            // been a file's missing parent, made with 0755).
            let mode = mode | 0o700;
            match self.mkdir(dst, mode) {
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.lstat(dst)?.is_dir() {
                        return Err(e);
                    }
                    if dst != "/" {
                        self.chmod(dst, mode)?;
                    }
                }
                r => r?,
            }
            if !whole {
                return Ok(0);
            }
            let mut n = 0;
            for e in std::fs::read_dir(src).map_err(|e| io_err(src, e))? {
                let e = e.map_err(|e| io_err(src, e))?;
                let name = e.file_name();
                let Some(name) = name.to_str() else {
                    return fail(
                        libc::EINVAL,
                        format!("{}: not a UTF-8 name", e.path().display()),
                    );
                };
                n += self.copy_entry(&e.path(), &path::join(dst, name), true)?;
            }
            return Ok(n);
        }
        if ft.is_symlink() {
            let t = std::fs::read_link(src).map_err(|e| io_err(src, e))?;
            let Some(t) = t.to_str() else {
                return fail(
                    libc::EINVAL,
                    format!("{}: link target is not UTF-8", src.display()),
                );
            };
            return match self.symlink(t, dst) {
                Err(e)
                    if e.errno() == libc::EEXIST
                        && self.readlink(dst).ok().as_deref() == Some(t) =>
                {
                    Ok(0)
                }
                r => r.map(|()| 0),
            };
        }
        if !ft.is_file() {
            return fail(
                libc::ENOTSUP,
                format!("{}: not a file, directory or link", src.display()),
            );
        }
        let mut f = std::fs::File::open(src).map_err(|e| io_err(src, e))?;
        let fd = self.open(dst, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)?;
        let mut buf = vec![0u8; COPY_BUF];
        let mut n = 0u64;
        let r: Result<()> = (|| loop {
            let k = f.read(&mut buf).map_err(|e| io_err(src, e))?;
            if k == 0 {
                return Ok(());
            }
            let mut off = 0;
            while off < k {
                match self.write(fd, &buf[off..k])? {
                    0 => return fail(libc::EIO, format!("{dst}: short write")),
                    w => off += w,
                }
            }
            n += k as u64;
        })();
        let closed = self.close(fd);
        r?;
        closed?;
        Ok(n)
    }
}
