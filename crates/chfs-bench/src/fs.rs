//! The two kinds of target: a chfs-rs pool through the native client, and
//! a directory through plain POSIX calls (a local directory, or a chfuse
//! mount). Paths are relative to the benchmark's own directory inside the
//! target. Every program of the package measures through these: the IO500
//! phases, the demo, the mount against the native client, the storage
//! engines through servers and cache mode.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

use chfs_client::{flags, Client};
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::pattern::FindSpec;

/// An open file of a target.
pub trait FileIo: Send {
    /// Writes all of `buf` at `off`.
    fn pwrite_all(&mut self, buf: &[u8], off: u64) -> Result<()>;
    /// Reads exactly `buf.len()` bytes at `off`.
    fn pread_exact(&mut self, buf: &mut [u8], off: u64) -> Result<()>;
    /// One read call at `off`: the bytes read, 0 at the end of the file.
    fn pread(&mut self, buf: &mut [u8], off: u64) -> Result<usize>;
    /// Makes what was written durable (fsync).
    fn fsync(&mut self) -> Result<()>;
    /// Closes the file (publishing what was written).
    fn close(self: Box<Self>) -> Result<()>;
}

/// What the benchmark needs from a file system.
pub trait Backend: Send + Sync {
    /// Creates a directory (an existing one is fine).
    fn mkdir(&self, path: &str) -> Result<()>;
    /// Removes an empty directory.
    fn rmdir(&self, path: &str) -> Result<()>;
    /// Creates (or opens) a file for writing, without truncating it.
    fn create(&self, path: &str) -> Result<Box<dyn FileIo>>;
    /// Opens an existing file for reading.
    fn open_read(&self, path: &str) -> Result<Box<dyn FileIo>>;
    /// Size of a file.
    fn size(&self, path: &str) -> Result<u64>;
    /// Removes a file.
    fn unlink(&self, path: &str) -> Result<()>;
    /// Removes `path` and everything below it.
    fn remove_all(&self, path: &str) -> Result<()>;
    /// Parallel find under `dir`.
    fn find(&self, dir: &str, spec: &FindSpec, threads: usize) -> Result<FindResult>;
    /// CPU time the servers behind it have used so far, all together (ns;
    /// None: not a pool, or a server did not say).
    fn server_cpu_ns(&self) -> Option<u64> {
        None
    }
}

/// The answer of a find.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindResult {
    /// Entries looked at (files and directories).
    pub examined: u64,
    /// Matching files (paths relative to the searched directory, sorted).
    pub matched: Vec<String>,
}

// ----- chfs-rs ---------------------------------------------------------

/// A chfs-rs pool, through [`chfs_client::Client`].
pub struct ChfsBackend {
    client: Client,
    root: String,
}

impl ChfsBackend {
    /// `root` is the absolute directory in the pool holding the benchmark.
    pub fn new(client: Client, root: &str) -> Self {
        ChfsBackend {
            client,
            root: root.trim_end_matches('/').to_string(),
        }
    }

    fn abs(&self, p: &str) -> String {
        if p.is_empty() {
            self.root.clone()
        } else {
            format!("{}/{p}", self.root)
        }
    }
}

struct ChfsFile {
    client: Client,
    fd: i32,
    path: String,
}

impl FileIo for ChfsFile {
    fn pwrite_all(&mut self, buf: &[u8], off: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self
                .client
                .pwrite(self.fd, &buf[done..], off + done as u64)
                .map_err(|e| BenchError::chfs("pwrite", &self.path, e))?;
            if n == 0 {
                return Err(BenchError::io(
                    "pwrite",
                    &self.path,
                    std::io::ErrorKind::WriteZero.into(),
                ));
            }
            done += n;
        }
        Ok(())
    }

    fn pread_exact(&mut self, buf: &mut [u8], off: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self
                .client
                .pread(self.fd, &mut buf[done..], off + done as u64)
                .map_err(|e| BenchError::chfs("pread", &self.path, e))?;
            if n == 0 {
                return Err(BenchError::ShortRead {
                    path: self.path.clone(),
                    off,
                    got: done,
                    want: buf.len(),
                });
            }
            done += n;
        }
        Ok(())
    }

    fn pread(&mut self, buf: &mut [u8], off: u64) -> Result<usize> {
        self.client
            .pread(self.fd, buf, off)
            .map_err(|e| BenchError::chfs("pread", &self.path, e))
    }

    fn fsync(&mut self) -> Result<()> {
        self.client
            .fsync(self.fd)
            .map_err(|e| BenchError::chfs("fsync", &self.path, e))
    }

    fn close(self: Box<Self>) -> Result<()> {
        self.client
            .close(self.fd)
            .map_err(|e| BenchError::chfs("close", &self.path, e))
    }
}

impl Backend for ChfsBackend {
    fn server_cpu_ns(&self) -> Option<u64> {
        self.client
            .server_status()
            .into_iter()
            .map(|(_, s)| s.ok().map(|s| s.cpu_ns))
            .sum()
    }

    fn mkdir(&self, path: &str) -> Result<()> {
        match self.client.mkdir(&self.abs(path), 0o755) {
            Err(e) if e.errno() == libc::EEXIST => Ok(()),
            r => r.map_err(|e| BenchError::chfs("mkdir", path, e)),
        }
    }

    fn rmdir(&self, path: &str) -> Result<()> {
        self.client
            .rmdir(&self.abs(path))
            .map_err(|e| BenchError::chfs("rmdir", path, e))
    }

    fn create(&self, path: &str) -> Result<Box<dyn FileIo>> {
        let fd = self
            .client
            .create(&self.abs(path), flags::O_WRONLY, 0o644)
            .map_err(|e| BenchError::chfs("create", path, e))?;
        Ok(Box::new(ChfsFile {
            client: self.client.clone(),
            fd,
            path: path.to_string(),
        }))
    }

    fn open_read(&self, path: &str) -> Result<Box<dyn FileIo>> {
        let fd = self
            .client
            .open(&self.abs(path), flags::O_RDONLY, 0)
            .map_err(|e| BenchError::chfs("open", path, e))?;
        Ok(Box::new(ChfsFile {
            client: self.client.clone(),
            fd,
            path: path.to_string(),
        }))
    }

    fn size(&self, path: &str) -> Result<u64> {
        self.client
            .stat(&self.abs(path))
            .map(|s| s.size)
            .map_err(|e| BenchError::chfs("stat", path, e))
    }

    fn unlink(&self, path: &str) -> Result<()> {
        self.client
            .unlink(&self.abs(path))
            .map_err(|e| BenchError::chfs("unlink", path, e))
    }

    fn remove_all(&self, path: &str) -> Result<()> {
        let st = self
            .client
            .lstat(&self.abs(path))
            .map_err(|e| BenchError::chfs("stat", path, e))?;
        if !st.is_dir() {
            return self.unlink(path);
        }
        let ents = self
            .client
            .readdir(&self.abs(path))
            .map_err(|e| BenchError::chfs("readdir", path, e))?;
        for e in ents {
            let child = if path.is_empty() {
                e.name
            } else {
                format!("{path}/{}", e.name)
            };
            if e.stat.is_dir() {
                self.remove_all(&child)?;
            } else {
                self.unlink(&child)?;
            }
        }
        self.rmdir(path)
    }

    /// One thread per server, each listing only its server's part of every
    /// directory (`readdir_index`); level by level, since a directory's
    /// own entry lives on one server but its children on all of them.
    fn find(&self, dir: &str, spec: &FindSpec, _threads: usize) -> Result<FindResult> {
        let nserv = self.client.server_count().max(1);
        let mut level = vec![String::new()];
        let mut out = FindResult::default();
        while !level.is_empty() {
            let parts: Vec<Result<WalkPart>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..nserv)
                    .map(|i| {
                        let level = &level;
                        s.spawn(move || {
                            let (mut examined, mut found, mut dirs) =
                                (0u64, Vec::new(), Vec::new());
                            for rel in level {
                                let base = if rel.is_empty() {
                                    dir.to_string()
                                } else {
                                    format!("{dir}/{rel}")
                                };
                                let ents = self
                                    .client
                                    .readdir_index(&self.abs(&base), i)
                                    .map_err(|e| BenchError::chfs("readdir_index", &base, e))?;
                                for e in ents {
                                    examined += 1;
                                    let r = if rel.is_empty() {
                                        e.name.clone()
                                    } else {
                                        format!("{rel}/{}", e.name)
                                    };
                                    if e.stat.is_dir() {
                                        dirs.push(r);
                                    } else if e.stat.is_file()
                                        && spec.matches(&e.name, e.stat.mtime, e.stat.size)
                                    {
                                        found.push(r);
                                    }
                                }
                            }
                            Ok((examined, found, dirs))
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(BenchError::Config("find thread panicked".into()))
                        })
                    })
                    .collect()
            });
            let mut next = Vec::new();
            for p in parts {
                let (n, f, d) = p?;
                out.examined += n;
                out.matched.extend(f);
                next.extend(d);
            }
            level = next;
        }
        out.matched.sort();
        Ok(out)
    }
}

// ----- POSIX -----------------------------------------------------------

/// A directory, through plain POSIX calls.
pub struct PosixBackend {
    root: PathBuf,
}

impl PosixBackend {
    /// `root` is the directory holding the benchmark.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PosixBackend { root: root.into() }
    }

    fn abs(&self, p: &str) -> PathBuf {
        if p.is_empty() {
            self.root.clone()
        } else {
            self.root.join(p)
        }
    }
}

struct PosixFile {
    f: File,
    path: String,
}

impl FileIo for PosixFile {
    fn pwrite_all(&mut self, buf: &[u8], off: u64) -> Result<()> {
        self.f
            .write_all_at(buf, off)
            .map_err(|e| BenchError::io("pwrite", &self.path, e))
    }

    fn pread_exact(&mut self, buf: &mut [u8], off: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.f.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => {
                    return Err(BenchError::ShortRead {
                        path: self.path.clone(),
                        off,
                        got: done,
                        want: buf.len(),
                    })
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(BenchError::io("pread", &self.path, e)),
            }
        }
        Ok(())
    }

    fn pread(&mut self, buf: &mut [u8], off: u64) -> Result<usize> {
        loop {
            match self.f.read_at(buf, off) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r.map_err(|e| BenchError::io("pread", &self.path, e)),
            }
        }
    }

    fn fsync(&mut self) -> Result<()> {
        self.f
            .sync_all()
            .map_err(|e| BenchError::io("fsync", &self.path, e))
    }

    fn close(self: Box<Self>) -> Result<()> {
        // close(2) errors are not reported by File's Drop; dropping is the
        // only close std offers. Data already reached the page cache.
        drop(self.f);
        Ok(())
    }
}

impl Backend for PosixBackend {
    fn mkdir(&self, path: &str) -> Result<()> {
        match std::fs::create_dir(self.abs(path)) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            r => r.map_err(|e| BenchError::io("mkdir", path, e)),
        }
    }

    fn rmdir(&self, path: &str) -> Result<()> {
        std::fs::remove_dir(self.abs(path)).map_err(|e| BenchError::io("rmdir", path, e))
    }

    fn create(&self, path: &str) -> Result<Box<dyn FileIo>> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(self.abs(path))
            .map_err(|e| BenchError::io("create", path, e))?;
        Ok(Box::new(PosixFile {
            f,
            path: path.to_string(),
        }))
    }

    fn open_read(&self, path: &str) -> Result<Box<dyn FileIo>> {
        let f = File::open(self.abs(path)).map_err(|e| BenchError::io("open", path, e))?;
        Ok(Box::new(PosixFile {
            f,
            path: path.to_string(),
        }))
    }

    fn size(&self, path: &str) -> Result<u64> {
        std::fs::metadata(self.abs(path))
            .map(|m| m.len())
            .map_err(|e| BenchError::io("stat", path, e))
    }

    fn unlink(&self, path: &str) -> Result<()> {
        std::fs::remove_file(self.abs(path)).map_err(|e| BenchError::io("unlink", path, e))
    }

    fn remove_all(&self, path: &str) -> Result<()> {
        std::fs::remove_dir_all(self.abs(path)).map_err(|e| BenchError::io("remove", path, e))
    }

    fn find(&self, dir: &str, spec: &FindSpec, threads: usize) -> Result<FindResult> {
        posix_find(&self.abs(dir), spec, threads)
    }
}

struct WalkState {
    queue: VecDeque<String>,
    busy: usize,
    failed: Option<BenchError>,
    out: FindResult,
}

/// Parallel directory walk with `threads` threads sharing a queue of
/// directories; a file is stat'ed only when its name matches.
pub fn posix_find(root: &Path, spec: &FindSpec, threads: usize) -> Result<FindResult> {
    let st = Mutex::new(WalkState {
        queue: VecDeque::from([String::new()]),
        busy: 0,
        failed: None,
        out: FindResult::default(),
    });
    let cv = Condvar::new();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let rel = {
                    let mut g = lock_walk(&st);
                    loop {
                        if g.failed.is_some() {
                            return;
                        }
                        if let Some(d) = g.queue.pop_front() {
                            g.busy += 1;
                            break d;
                        }
                        if g.busy == 0 {
                            cv.notify_all();
                            return;
                        }
                        g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
                    }
                };
                let r = walk_one(root, &rel, spec);
                let mut g = lock_walk(&st);
                g.busy -= 1;
                match r {
                    Ok((n, found, dirs)) => {
                        g.out.examined += n;
                        g.out.matched.extend(found);
                        g.queue.extend(dirs);
                    }
                    Err(e) => g.failed = Some(e),
                }
                cv.notify_all();
            });
        }
    });
    let mut g = st.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = g.failed.take() {
        return Err(e);
    }
    g.out.matched.sort();
    Ok(g.out)
}

fn lock_walk(m: &Mutex<WalkState>) -> std::sync::MutexGuard<'_, WalkState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type WalkPart = (u64, Vec<String>, Vec<String>);

fn walk_one(root: &Path, rel: &str, spec: &FindSpec) -> Result<WalkPart> {
    let dir = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    let rd = std::fs::read_dir(&dir).map_err(|e| BenchError::io("opendir", dir.display(), e))?;
    let (mut n, mut found, mut dirs) = (0u64, Vec::new(), Vec::new());
    for e in rd {
        let e = e.map_err(|e| BenchError::io("readdir", dir.display(), e))?;
        n += 1;
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let ft = e.file_type().map_err(|e| BenchError::io("stat", &r, e))?;
        if ft.is_dir() {
            dirs.push(r);
        } else if ft.is_file() && spec.name_matches(&name) {
            let m = e.metadata().map_err(|e| BenchError::io("stat", &r, e))?;
            let mtime = m.mtime() * 1_000_000_000 + m.mtime_nsec();
            if spec.matches(&name, mtime, m.size()) {
                found.push(r);
            }
        }
    }
    Ok((n, found, dirs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent, sequential, recursive walk.
    fn simple_walk(root: &Path, rel: &str, spec: &FindSpec, out: &mut FindResult) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            out.examined += 1;
            let name = e.file_name().into_string().unwrap();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                simple_walk(root, &r, spec, out);
            } else if m.is_file() {
                let mtime = m.mtime() * 1_000_000_000 + m.mtime_nsec();
                if spec.matches(&name, mtime, m.size()) {
                    out.matched.push(r);
                }
            }
        }
    }

    #[test]
    fn parallel_posix_find_agrees_with_a_simple_walk() {
        let t = tempfile::tempdir().unwrap();
        let b = PosixBackend::new(t.path());
        for d in ["a", "a/b", "a/b/c", "d", "e01"] {
            b.mkdir(d).unwrap();
        }
        let data = vec![7u8; crate::pattern::MD_HARD_SIZE];
        let mut n = 0;
        for d in ["", "a", "a/b", "a/b/c", "d", "e01"] {
            for i in 0..130u64 {
                let p = if d.is_empty() {
                    format!("f.{i}")
                } else {
                    format!("{d}/f.{i}")
                };
                let mut f = b.create(&p).unwrap();
                // some of the right size, some not
                let len = if i % 3 == 0 { 10 } else { data.len() };
                f.pwrite_all(&data[..len], 0).unwrap();
                f.close().unwrap();
                n += 1;
            }
        }
        assert_eq!(n, 780);
        let spec = FindSpec::io500(0);
        let mut want = FindResult::default();
        simple_walk(t.path(), "", &spec, &mut want);
        want.matched.sort();
        for threads in [1, 2, 5] {
            let got = b.find("", &spec, threads).unwrap();
            assert_eq!(got, want, "threads={threads}");
        }
        assert!(!want.matched.is_empty());
        // "newer than the future" matches nothing, but still examines all
        let later = FindSpec::io500(i64::MAX);
        let got = b.find("", &later, 3).unwrap();
        assert!(got.matched.is_empty());
        assert_eq!(got.examined, want.examined);
    }

    #[test]
    fn posix_errors_name_the_path() {
        let t = tempfile::tempdir().unwrap();
        let b = PosixBackend::new(t.path());
        let e = b.open_read("nope/x").err().unwrap();
        assert!(e.to_string().contains("nope/x"), "{e}");
        let mut f = b.create("small").unwrap();
        f.pwrite_all(b"abc", 0).unwrap();
        f.close().unwrap();
        let mut f = b.open_read("small").unwrap();
        let mut buf = [0u8; 8];
        assert!(matches!(
            f.pread_exact(&mut buf, 0),
            Err(BenchError::ShortRead {
                got: 3,
                want: 8,
                ..
            })
        ));
        assert!(b.find("missing", &FindSpec::io500(0), 2).is_err());
    }
}
