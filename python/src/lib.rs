//! `chfs._chfs`: the native module of the `chfs` Python package, a thin
//! adapter over [`chfs_client::Client`] like the C API (crates/chfs-capi):
//! it translates arguments, results and errors, and holds no file-system
//! logic of its own. The Python side (python/chfs/) builds the `io`
//! objects, `os`-like calls and the fsspec filesystem on it.
//!
//! - Errors are `OSError(errno, message, filename)`: Python picks the
//!   subclass (`FileNotFoundError` for ENOENT, ...) from the errno the
//!   client carries.
//! - Every call that talks to the servers releases the GIL.
//! - Reads go straight into the caller's buffer (`readinto`), writes come
//!   straight from the caller's buffer: no copy in between.
//! - After `fork` the child makes its own connections on its first call
//!   (the parent's are shared sockets: they are left alone, not closed),
//!   and a file opened before the fork is reopened at its position on its
//!   first use in the child, as the preload layer does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use chfs_client::{ClientConfig, DirEntry, Stat, Whence};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

type CResult<T> = chfs_client::Result<T>;

/// The client's error as an `OSError` (subclass chosen by Python from the
/// errno), naming `path` when there is one.
fn os_error(e: chfs_client::Error, path: Option<&str>) -> PyErr {
    match path {
        Some(p) => PyOSError::new_err((e.errno(), e.message().to_string(), p.to_string())),
        None => PyOSError::new_err((e.errno(), e.message().to_string())),
    }
}

fn errno_error(errno: i32, msg: &str) -> PyErr {
    PyOSError::new_err((errno, msg.to_string()))
}

/// A status as the tuple `chfs._os.stat_result` reads: mode, ino, nlink,
/// uid, gid, size, atime_ns, mtime_ns, ctime_ns, blksize, blocks, rdev.
type StatTuple = (u32, u64, u32, u32, u32, u64, i64, i64, i64, u32, u64, u64);

fn stat_tuple(s: &Stat) -> StatTuple {
    (
        s.mode, s.ino, s.nlink, s.uid, s.gid, s.size, s.atime, s.mtime, s.ctime, s.blksize,
        s.blocks, s.rdev,
    )
}

// ----- the client of this process ----------------------------------------

struct Live {
    client: chfs_client::Client,
    /// Process that made `client`.
    pid: u32,
    /// Bumped for every client made (a forked child makes its own).
    gen: u64,
}

/// A handle to a chfs-rs pool.
///
/// `Client(servers=None)`: `servers` (a comma-separated string or a list
/// of `host:port`) replaces `CHFS_SERVER`; every other setting, the secret
/// included (`CHFS_SECRET_FILE`, `CHFS_SECRET`), comes from the
/// environment as for every chfs-rs client (`chfs_client::config`).
#[pyclass(frozen, module = "chfs._chfs", name = "Client")]
struct PyClient {
    cfg: ClientConfig,
    live: RwLock<Live>,
}

impl PyClient {
    /// The client of this process and its generation; a forked child
    /// connects anew (once), without the GIL and without holding a lock
    /// meanwhile.
    fn get(&self, py: Python<'_>) -> PyResult<(chfs_client::Client, u64)> {
        let pid = std::process::id();
        {
            let g = self.live.read().unwrap_or_else(|e| e.into_inner());
            if g.pid == pid {
                return Ok((g.client.clone(), g.gen));
            }
        }
        let cfg = self.cfg.clone();
        let fresh = py
            .detach(|| chfs_client::Client::connect(cfg))
            .map_err(|e| os_error(e, None))?;
        let mut g = self.live.write().unwrap_or_else(|e| e.into_inner());
        if g.pid != pid {
            let old = std::mem::replace(&mut g.client, fresh);
            // The parent's connections are shared sockets: closing them
            // here would cut the parent off. Leak them.
            std::mem::forget(old);
            g.pid = pid;
            g.gen += 1;
        }
        // Else another thread connected first: `fresh` (this process's
        // own) is dropped.
        Ok((g.client.clone(), g.gen))
    }

    /// Runs `f` on the client without the GIL; errors name `path`.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        path: Option<&str>,
        f: impl FnOnce(&chfs_client::Client) -> CResult<T> + Send,
    ) -> PyResult<T> {
        let (c, _) = self.get(py)?;
        py.detach(|| f(&c)).map_err(|e| os_error(e, path))
    }
}

fn servers_arg(servers: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<String>>> {
    let Some(s) = servers else { return Ok(None) };
    if s.is_none() {
        return Ok(None);
    }
    if let Ok(text) = s.extract::<String>() {
        return Ok(Some(chfs_client::config::parse_servers(&text)));
    }
    let list: Vec<String> = s.extract()?;
    Ok(Some(chfs_client::config::parse_servers(&list.join(","))))
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (servers=None))]
    fn new(py: Python<'_>, servers: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let mut cfg = ClientConfig::from_env().map_err(|e| os_error(e, None))?;
        // Python's io objects buffer themselves; the client's strided
        // read-ahead (CHFS_READ_AHEAD) is for the native and C API paths.
        cfg.read_ahead = 0;
        if let Some(s) = servers_arg(servers)? {
            cfg.servers = s;
        }
        if cfg.servers.is_empty() {
            return Err(errno_error(
                libc::EINVAL,
                "no server: pass servers= or set CHFS_SERVER",
            ));
        }
        let c = cfg.clone();
        let client = py
            .detach(|| chfs_client::Client::connect(c))
            .map_err(|e| os_error(e, None))?;
        Ok(Self {
            cfg,
            live: RwLock::new(Live {
                client,
                pid: std::process::id(),
                gen: 0,
            }),
        })
    }

    /// Addresses of the pool's servers, in placement order.
    fn servers(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.get(py)?.0.servers())
    }

    /// Status of `path`, following a final symbolic link.
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<StatTuple> {
        self.call(py, Some(path), |c| c.stat(path).map(|s| stat_tuple(&s)))
    }

    /// Status of `path` itself (a symbolic link is not followed).
    fn lstat(&self, py: Python<'_>, path: &str) -> PyResult<StatTuple> {
        self.call(py, Some(path), |c| c.lstat(path).map(|s| stat_tuple(&s)))
    }

    /// `(name, status)` of every entry of a directory, sorted by name.
    fn readdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, StatTuple)>> {
        let v: Vec<DirEntry> = self.call(py, Some(path), |c| c.readdir(path))?;
        Ok(v.iter()
            .map(|e| (e.name.clone(), stat_tuple(&e.stat)))
            .collect())
    }

    /// Every entry below the directory `path` (not `path` itself), down to
    /// `maxdepth` levels (None: all; 1: the entries of `path`). The whole
    /// tree is asked of every server at once (`Client::list_tree`, one
    /// request per server and page, sorted); with a `maxdepth`, or when a
    /// server does not serve that (older, cache mode) or fails, it is
    /// walked in parallel one server at a time (`Client::walk_parallel`,
    /// the walk of chfind). Returns `(entries, errors)`: `(full path,
    /// status)` (in no particular order after a walk), and `(directory,
    /// errno, message)` of directories that could not be read.
    #[pyo3(signature = (path, maxdepth=None, threads=0))]
    #[allow(clippy::type_complexity)]
    fn find(
        &self,
        py: Python<'_>,
        path: &str,
        maxdepth: Option<usize>,
        threads: usize,
    ) -> PyResult<(Vec<(String, StatTuple)>, Vec<(String, i32, String)>)> {
        let (c, _) = self.get(py)?;
        let root = normalized(path)?;
        let depth0 = components(&root);
        let threads = walk_threads(&c, threads);
        if maxdepth.is_none() {
            // The whole tree: one request per server and page (servers
            // that do not serve it, and any error, fall back to the walk,
            // which reports errors directory by directory).
            let tree = py.detach(|| {
                let t = c.list_tree(&root, true).ok()??;
                Some(
                    tree_stats(&t)
                        .map(|(p, s)| (p.to_string(), stat_tuple(&s)))
                        .collect::<Vec<_>>(),
                )
            });
            if let Some(found) = tree {
                return Ok((found, Vec::new()));
            }
        }
        let (found, errors) = py.detach(|| {
            let (found, errors) = c.walk_parallel_with(
                &root,
                threads,
                &|_| true,
                &Vec::new,
                &|found: &mut Vec<(String, StatTuple)>, full, e| {
                    found.push((full.to_string(), stat_tuple(&e.stat)));
                    maxdepth.is_none_or(|m| components(full) - depth0 < m)
                },
            );
            (joined(found), errors)
        });
        Ok((found, walk_errors(errors)))
    }

    /// [`PyClient::find`] as fsspec's `find(detail=True)` returns it: a
    /// dict of full path to info dict (the keys and values `chfs.spec`'s
    /// `_info` gives for a status without a link target), in sorted
    /// order, directories only with `withdirs`; made here (no status
    /// tuple or `os.stat_result` per entry). Returns `(dict, errors)`.
    #[pyo3(signature = (path, maxdepth=None, withdirs=false, threads=0))]
    #[allow(clippy::type_complexity)]
    fn find_info<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        maxdepth: Option<usize>,
        withdirs: bool,
        threads: usize,
    ) -> PyResult<(Bound<'py, PyDict>, Vec<(String, i32, String)>)> {
        let (c, _) = self.get(py)?;
        let root = normalized(path)?;
        let keep = |s: &Stat| withdirs || !s.is_dir();
        if maxdepth.is_none() {
            if let Some(t) = py.detach(|| c.list_tree(&root, true).ok().flatten()) {
                let mut infos = Infos::new(py);
                for (p, s) in tree_stats(&t) {
                    if keep(&s) {
                        infos.add(p, &s)?;
                    }
                }
                return Ok((infos.out, Vec::new()));
            }
        }
        let threads = walk_threads(&c, threads);
        let depth0 = components(&root);
        let (found, errors) = py.detach(|| {
            let (found, errors) = c.walk_parallel_with(
                &root,
                threads,
                &|_| true,
                &Vec::new,
                &|found: &mut Vec<(String, Stat)>, full, e| {
                    if keep(&e.stat) {
                        found.push((full.to_string(), e.stat));
                    }
                    maxdepth.is_none_or(|m| components(full) - depth0 < m)
                },
            );
            let mut found = joined(found);
            found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            (found, errors)
        });
        let mut infos = Infos::new(py);
        for (p, s) in &found {
            infos.add(p, s)?;
        }
        Ok((infos.out, walk_errors(errors)))
    }

    /// The paths below the directory `path`, sorted, as [`PyClient::find`]
    /// walks them: regular files and everything else but directories, and
    /// directories too with `withdirs` (fsspec's `find` without details:
    /// no status crosses into Python). Returns `(paths, errors)`.
    #[pyo3(signature = (path, maxdepth=None, withdirs=false, threads=0))]
    #[allow(clippy::type_complexity)]
    fn find_paths<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        maxdepth: Option<usize>,
        withdirs: bool,
        threads: usize,
    ) -> PyResult<(Bound<'py, PyList>, Vec<(String, i32, String)>)> {
        let (c, _) = self.get(py)?;
        let root = normalized(path)?;
        if maxdepth.is_none() {
            // The whole tree: one request per server and page, merged in
            // order; the list of str is made in one pass over the one
            // buffer of paths (see `find`).
            if let Some(t) = py.detach(|| c.list_tree(&root, false).ok().flatten()) {
                let list = if withdirs {
                    PyList::new(py, (0..t.len()).map(|i| t.path(i)))?
                } else {
                    let paths: Vec<&str> = (0..t.len())
                        .filter(|&i| !t.is_dir(i))
                        .map(|i| t.path(i))
                        .collect();
                    PyList::new(py, paths)?
                };
                return Ok((list, Vec::new()));
            }
        }
        let threads = walk_threads(&c, threads);
        let depth0 = components(&root);
        let (paths, errors) = py.detach(|| {
            // Each thread's paths: runs in name order (a directory's
            // entries on one server), which the merge sort takes as they
            // are (about half the comparisons of an unstable sort here).
            let (found, errors) = c.walk_parallel_with(
                &root,
                threads,
                &|_| true,
                &Vec::new,
                &|found: &mut Vec<String>, full, e| {
                    if withdirs || !e.stat.is_dir() {
                        found.push(full.to_string());
                    }
                    maxdepth.is_none_or(|m| components(full) - depth0 < m)
                },
            );
            let mut paths = joined(found);
            paths.sort();
            (paths, errors)
        });
        Ok((PyList::new(py, paths)?, walk_errors(errors)))
    }

    /// Creates a directory.
    #[pyo3(signature = (path, mode=0o777))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.call(py, Some(path), |c| c.mkdir(path, mode))
    }

    /// Creates a directory and its missing parents (an existing directory
    /// is no error).
    #[pyo3(signature = (path, mode=0o777))]
    fn makedirs(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.call(py, Some(path), |c| c.mkdir_all(path, mode))
    }

    /// Removes an empty directory.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.call(py, Some(path), |c| c.rmdir(path))
    }

    /// Removes a file (or symbolic link, special file).
    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        self.call(py, Some(path), |c| c.unlink(path))
    }

    /// Renames `src` to `dst` (replacing a file or empty directory).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        self.call(py, Some(src), |c| c.rename(src, dst))
    }

    /// Sets the size of a file.
    fn truncate(&self, py: Python<'_>, path: &str, length: u64) -> PyResult<()> {
        self.call(py, Some(path), |c| c.truncate(path, length))
    }

    /// Changes the permission bits.
    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        self.call(py, Some(path), |c| c.chmod(path, mode).map(|_| ()))
    }

    /// Sets access and modification times (ns since the epoch).
    fn utime_ns(&self, py: Python<'_>, path: &str, atime: i64, mtime: i64) -> PyResult<()> {
        use chfs_client::TimeSet;
        self.call(py, Some(path), |c| {
            c.utimens(path, TimeSet::At(atime), TimeSet::At(mtime))
                .map(|_| ())
        })
    }

    /// Creates a symbolic link `path` pointing to `target`.
    fn symlink(&self, py: Python<'_>, target: &str, path: &str) -> PyResult<()> {
        self.call(py, Some(path), |c| c.symlink(target, path))
    }

    /// The target of a symbolic link.
    fn readlink(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        self.call(py, Some(path), |c| c.readlink(path))
    }

    /// Capacity of the pool: `(total, used, free, entries, servers)`.
    fn statfs(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u64, u32)> {
        self.call(py, None, |c| {
            c.statfs()
                .map(|s| (s.total, s.used, s.free, s.entries, s.servers))
        })
    }

    /// Cache mode: writes every server's dirty chunks back to the backend
    /// and waits until they are written.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.call(py, None, |c| c.sync())
    }

    /// Cache mode: write-back state of everything under `path`, summed
    /// over the servers: `(dirty chunks, their bytes, chunks whose last
    /// write-back failed, errno of the last failure, its message)`.
    fn flush_status(&self, py: Python<'_>, path: &str) -> PyResult<(u64, u64, u64, i32, String)> {
        self.call(py, Some(path), |c| {
            c.flush_status(path)
                .map(|s| (s.chunks, s.bytes, s.failing, s.last_errno, s.last_error))
        })
    }

    /// Cache mode: waits until `path` is written back (None: no limit;
    /// ETIMEDOUT after `timeout` seconds).
    #[pyo3(signature = (path, timeout=None))]
    fn wait_flushed(&self, py: Python<'_>, path: &str, timeout: Option<f64>) -> PyResult<()> {
        let t = match timeout {
            Some(s) if !(s >= 0.0 && s.is_finite()) => {
                return Err(PyValueError::new_err("timeout must be a number >= 0"))
            }
            Some(s) => Some(std::time::Duration::from_secs_f64(s)),
            None => None,
        };
        self.call(py, Some(path), |c| c.wait_flushed(path, t))
    }

    /// Cache mode: copies `path` (a file or a tree of the backend) into
    /// the pool; returns the bytes staged.
    fn stagein(&self, py: Python<'_>, path: &str) -> PyResult<u64> {
        self.call(py, Some(path), |c| c.stagein(path))
    }

    /// Opens a file with open(2) flags (`os.O_*`) and `mode` for a
    /// created file; `chunk_size` for a file this call creates (0: the
    /// client's).
    #[pyo3(signature = (path, flags, mode=0o666, chunk_size=0))]
    fn open(
        slf: &Bound<'_, Self>,
        path: &str,
        flags: i32,
        mode: u32,
        chunk_size: u32,
    ) -> PyResult<PyFile> {
        let py = slf.py();
        let this = slf.get();
        let (c, gen) = this.get(py)?;
        let cfd = py
            .detach(|| {
                if chunk_size > 0 {
                    c.open_chunk_size(path, flags, mode, chunk_size)
                } else {
                    c.open(path, flags, mode)
                }
            })
            .map_err(|e| os_error(e, Some(path)))?;
        Ok(PyFile {
            client: slf.clone().unbind(),
            path: path.to_string(),
            flags,
            h: Mutex::new(Handle {
                gen,
                cfd,
                closed: false,
            }),
            pos: AtomicU64::new(0),
        })
    }
}

/// Threads of a parallel walk: `n`, or 0 for 4 per server (4 to 64), as
/// chfind.
/// fsspec info dicts made natively (see [`PyClient::find_info`]): the
/// keys made once, the values as `chfs.spec._info` computes them from an
/// `os.stat_result` (times as `ns / 1e9`).
struct Infos<'py> {
    py: Python<'py>,
    out: Bound<'py, PyDict>,
    keys: [Bound<'py, PyString>; 11],
    kinds: [Bound<'py, PyString>; 3],
}

impl<'py> Infos<'py> {
    fn new(py: Python<'py>) -> Self {
        let k = |s| PyString::intern(py, s);
        Self {
            py,
            out: PyDict::new(py),
            keys: [
                k("name"),
                k("size"),
                k("type"),
                k("created"),
                k("islink"),
                k("mode"),
                k("uid"),
                k("gid"),
                k("mtime"),
                k("ino"),
                k("nlink"),
            ],
            kinds: [k("directory"), k("file"), k("other")],
        }
    }

    fn add(&mut self, path: &str, s: &Stat) -> PyResult<()> {
        const S_IFMT: u32 = 0o170000;
        let fmt = s.mode & S_IFMT;
        let kind = match fmt {
            0o040000 => &self.kinds[0],
            0o100000 => &self.kinds[1],
            _ => &self.kinds[2],
        };
        let py = self.py;
        let name = PyString::new(py, path);
        let d = PyDict::new(py);
        let k = &self.keys;
        d.set_item(&k[0], &name)?;
        d.set_item(&k[1], s.size)?;
        d.set_item(&k[2], kind)?;
        d.set_item(&k[3], s.ctime as f64 / 1e9)?;
        d.set_item(&k[4], fmt == 0o120000)?;
        d.set_item(&k[5], s.mode)?;
        d.set_item(&k[6], s.uid)?;
        d.set_item(&k[7], s.gid)?;
        d.set_item(&k[8], s.mtime as f64 / 1e9)?;
        d.set_item(&k[9], s.ino)?;
        d.set_item(&k[10], s.nlink)?;
        self.out.set_item(name, d)
    }
}

fn walk_threads(c: &chfs_client::Client, n: usize) -> usize {
    if n == 0 {
        (c.server_count() * 4).clamp(4, 64)
    } else {
        n
    }
}

fn walk_errors(errors: Vec<chfs_client::WalkError>) -> Vec<(String, i32, String)> {
    errors
        .into_iter()
        .map(|w| (w.dir, w.error.errno(), w.error.message().to_string()))
        .collect()
}

/// The walk threads' findings in one vector (moved, not copied).
fn joined<T>(parts: Vec<Vec<T>>) -> Vec<T> {
    let mut all = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for mut p in parts {
        all.append(&mut p);
    }
    all
}

/// `path` normalised, or the OSError naming it.
fn normalized(path: &str) -> PyResult<String> {
    chfs_proto::path::normalize(path).map_err(|e| os_error(chfs_client::Error::from(e), Some(path)))
}

/// The entries of a tree listing made with headers, as paths and statuses
/// (an entry whose header is missing is left out).
fn tree_stats(t: &chfs_client::TreeListing) -> impl Iterator<Item = (&str, Stat)> + '_ {
    (0..t.len()).filter_map(move |i| {
        let p = t.path(i);
        Some((p, Stat::from_meta(p, t.meta(i)?)))
    })
}

fn components(p: &str) -> usize {
    p.split('/').filter(|c| !c.is_empty()).count()
}

// ----- buffers -----------------------------------------------------------

/// A contiguous buffer of a Python object, held (so its memory stays put)
/// until dropped.
struct View {
    view: Box<ffi::Py_buffer>,
}

impl View {
    /// The object's buffer; `writable` asks for one that may be written.
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<View> {
        let mut view = Box::<ffi::Py_buffer>::new_uninit();
        let flags = if writable {
            ffi::PyBUF_WRITABLE
        } else {
            ffi::PyBUF_SIMPLE
        };
        // SAFETY: `obj` is a live object (we hold the GIL through `obj`'s
        // token) and `view` points to memory for one Py_buffer, which
        // PyObject_GetBuffer fills in on success. PyBUF_SIMPLE (with or
        // without WRITABLE) asks for a C-contiguous buffer of bytes.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            let e = PyErr::fetch(obj.py());
            if writable && e.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) {
                // As FileIO.readinto says it.
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "readinto() argument must be read-write bytes-like object: {e}"
                )));
            }
            return Err(e);
        }
        // SAFETY: filled in by the successful PyObject_GetBuffer above.
        let view = unsafe { view.assume_init() };
        Ok(View { view })
    }

    fn len(&self) -> usize {
        usize::try_from(self.view.len).unwrap_or(0)
    }

    fn raw(&self) -> Raw {
        Raw {
            ptr: self.view.buf.cast::<u8>(),
            len: self.len(),
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: the view was filled in by PyObject_GetBuffer and is
        // released exactly once, here, with the GIL held (`attach`).
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// The memory of a [`View`], handed to a call made without the GIL.
#[derive(Clone, Copy)]
struct Raw {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `Raw` is the address of memory that a held `View` keeps valid
// (the exporter may not move or free it until the view is released); it
// is used by one call at a time, on the thread that released the GIL.
unsafe impl Send for Raw {}

impl Raw {
    /// # Safety
    /// The `View` this came from is alive for as long as the slice.
    unsafe fn slice<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller keeps the view alive; the view is `len`
        // contiguous bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// # Safety
    /// As [`Raw::slice`], and the view is writable.
    unsafe fn slice_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `slice`; the buffer was asked for writable. Other
        // Python threads may touch the same bytes meanwhile (as with
        // FileIO.readinto, which also reads without the GIL); any value is
        // a valid u8.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// ----- open files --------------------------------------------------------

struct Handle {
    /// Client generation `cfd` belongs to.
    gen: u64,
    cfd: i32,
    closed: bool,
}

/// An open file of the pool (the raw layer of `chfs.open`'s io objects).
/// Reads and writes start at the file's position and advance it
/// (`O_APPEND` writes go to the end, chosen by the server).
#[pyclass(frozen, module = "chfs._chfs", name = "File")]
struct PyFile {
    client: Py<PyClient>,
    path: String,
    flags: i32,
    h: Mutex<Handle>,
    pos: AtomicU64,
}

impl PyFile {
    /// The client and this file's descriptor in it, reopened in a forked
    /// child (at the position, kept here, that it had). No lock is held
    /// while the GIL is released (a thread waiting for the lock with the
    /// GIL would deadlock with one waiting for the GIL with the lock).
    fn fd(&self, py: Python<'_>) -> PyResult<(chfs_client::Client, i32)> {
        let (c, gen) = self.client.get().get(py)?;
        {
            let h = self.h.lock().unwrap_or_else(|e| e.into_inner());
            if h.closed {
                return Err(PyValueError::new_err("I/O operation on closed file"));
            }
            if h.gen == gen {
                return Ok((c, h.cfd));
            }
        }
        let flags = self.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        let c2 = c.clone();
        let cfd = py
            .detach(|| c2.open(&self.path, flags, 0))
            .map_err(|e| os_error(e, Some(&self.path)))?;
        let mut h = self.h.lock().unwrap_or_else(|e| e.into_inner());
        if h.gen == gen || h.closed {
            // Another thread reopened (or closed) it meanwhile.
            let _ = c.close(cfd);
            if h.closed {
                return Err(PyValueError::new_err("I/O operation on closed file"));
            }
            return Ok((c, h.cfd));
        }
        h.gen = gen;
        h.cfd = cfd;
        Ok((c, cfd))
    }

    fn err(&self, e: chfs_client::Error) -> PyErr {
        os_error(e, Some(&self.path))
    }

    fn appending(&self) -> bool {
        self.flags & libc::O_APPEND != 0
    }
}

#[pymethods]
impl PyFile {
    /// The path this file was opened with.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The open(2) flags.
    #[getter]
    fn flags(&self) -> i32 {
        self.flags
    }

    /// Is it closed?
    #[getter]
    fn closed(&self) -> bool {
        self.h.lock().unwrap_or_else(|e| e.into_inner()).closed
    }

    /// Reads into `buffer` (any writable contiguous buffer: bytearray,
    /// memoryview, numpy array) at the position; returns the bytes read
    /// (0 at the end of the file).
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let view = View::get(buffer, true)?;
        let raw = view.raw();
        let (c, fd) = self.fd(py)?;
        let off = self.pos.load(Ordering::Relaxed);
        let n = py
            .detach(move || {
                // SAFETY: `view` (alive until the end of this function)
                // keeps the writable buffer in place.
                let buf = unsafe { raw.slice_mut() };
                c.pread(fd, buf, off)
            })
            .map_err(|e| self.err(e))?;
        self.pos.store(off + n as u64, Ordering::Relaxed);
        drop(view);
        Ok(n)
    }

    /// Reads up to `size` bytes at the position (the rest of the file for
    /// a negative size).
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let (c, fd) = self.fd(py)?;
        let off = self.pos.load(Ordering::Relaxed);
        let want = if size < 0 {
            let st = py.detach(|| c.fstat(fd)).map_err(|e| self.err(e))?;
            st.size.saturating_sub(off) as usize
        } else {
            size as usize
        };
        let mut buf = vec![0u8; want];
        let n = py
            .detach(|| c.pread(fd, &mut buf, off))
            .map_err(|e| self.err(e))?;
        self.pos.store(off + n as u64, Ordering::Relaxed);
        Ok(PyBytes::new(py, &buf[..n]))
    }

    /// Writes `data` (any contiguous buffer) at the position (at the end
    /// with O_APPEND); returns the bytes written.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let view = View::get(data, false)?;
        let raw = view.raw();
        let (c, fd) = self.fd(py)?;
        let append = self.appending();
        let off = self.pos.load(Ordering::Relaxed);
        let (n, end) = py
            .detach(move || {
                // SAFETY: `view` (alive until the end of this function)
                // keeps the buffer in place.
                let buf = unsafe { raw.slice() };
                if append {
                    let n = c.write(fd, buf)?;
                    Ok((n, c.seek(fd, 0, Whence::Cur)?))
                } else {
                    let n = c.pwrite(fd, buf, off)?;
                    Ok((n, off + n as u64))
                }
            })
            .map_err(|e| self.err(e))?;
        self.pos.store(end, Ordering::Relaxed);
        drop(view);
        Ok(n)
    }

    /// Moves the position (`whence` 0: from the start, 1: from the
    /// position, 2: from the end); returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let base = match whence {
            0 => 0,
            1 => self.pos.load(Ordering::Relaxed) as i64,
            2 => {
                let (c, fd) = self.fd(py)?;
                py.detach(|| c.fstat(fd)).map_err(|e| self.err(e))?.size as i64
            }
            _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
        };
        let p = base
            .checked_add(offset)
            .filter(|p| *p >= 0)
            .ok_or_else(|| errno_error(libc::EINVAL, "negative seek position"))?;
        // A closed file cannot seek either.
        self.fd(py)?;
        self.pos.store(p as u64, Ordering::Relaxed);
        Ok(p as u64)
    }

    /// The position.
    fn tell(&self) -> u64 {
        self.pos.load(Ordering::Relaxed)
    }

    /// Sets the file's size (the position stays).
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<u64> {
        let (c, fd) = self.fd(py)?;
        py.detach(|| c.ftruncate(fd, size))
            .map_err(|e| self.err(e))?;
        Ok(size)
    }

    /// The file's status.
    fn fstat(&self, py: Python<'_>) -> PyResult<StatTuple> {
        let (c, fd) = self.fd(py)?;
        py.detach(|| c.fstat(fd))
            .map(|s| stat_tuple(&s))
            .map_err(|e| self.err(e))
    }

    /// Sends buffered writes (`CHFS_BUF_SIZE`) to the servers.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let (c, fd) = self.fd(py)?;
        py.detach(|| c.flush(fd)).map_err(|e| self.err(e))
    }

    /// Publishes the size and buffered writes: other clients opening the
    /// file from now on see them.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        let (c, fd) = self.fd(py)?;
        py.detach(|| c.fsync(fd)).map_err(|e| self.err(e))
    }

    /// Closes the file, publishing its size; the first write error is
    /// reported here. Closing twice is no error.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let (c, gen) = self.client.get().get(py)?;
        let (cfd, mine) = {
            let mut h = self.h.lock().unwrap_or_else(|e| e.into_inner());
            if h.closed {
                return Ok(());
            }
            h.closed = true;
            (h.cfd, h.gen == gen)
        };
        if !mine {
            // Opened before a fork and unused since in this process:
            // the descriptor belongs to the parent's client.
            return Ok(());
        }
        py.detach(|| c.close(cfd)).map_err(|e| self.err(e))
    }

    fn __repr__(&self) -> String {
        format!("<chfs._chfs.File {:?} flags={:#o}>", self.path, self.flags)
    }
}

impl Drop for PyFile {
    fn drop(&mut self) {
        let h = self.h.get_mut().unwrap_or_else(|e| e.into_inner());
        if h.closed {
            return;
        }
        // Not closed (the io objects close their raw file; this is for a
        // File used by itself): release the descriptor if it is this
        // process's. Errors have nobody to go to.
        let live = self
            .client
            .get()
            .live
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if live.pid == std::process::id() && live.gen == h.gen {
            let _ = live.client.close(h.cfd);
        }
    }
}

/// The native module.
#[pymodule]
fn _chfs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyClient>()?;
    m.add_class::<PyFile>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
