//! `chfs-bench fuse` (formerly the `chfuse-bench` program of chfs-fuse):
//! a chfuse mount vs the native client vs a local reference directory
//! (default /dev/shm), in one run, on a fresh local pool.
//!
//! - sequential write (then fsync) and read of one file in 1 MiB requests;
//! - create+close, stat and unlink of many empty files.
//!
//! Prints MiB/s and ops/s and the ratio mount / native. The three targets
//! are [`Backend`]s: [`PosixBackend`] on the reference and on the mount,
//! [`ChfsBackend`] for the native client. `chfuse` is looked for next to
//! this program, then on `$PATH`: build with `cargo build --release -p
//! chfs-server -p chfs-fuse -p chfs-bench` and run `target/release/chfs-bench
//! fuse [--size-mib 2048 --files 20000]`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Args;

use crate::error::{BenchError, Result};
use crate::fs::{Backend, ChfsBackend, PosixBackend};
use crate::scratch::ScratchDir;

/// Options of `chfs-bench fuse`.
#[derive(Args, Debug, Clone)]
pub struct FuseArgs {
    /// Servers in the local pool.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// File size of the sequential test, MiB.
    #[arg(long, default_value_t = 2048)]
    pub size_mib: usize,
    /// Request size, KiB.
    #[arg(long, default_value_t = 1024)]
    pub block_kib: usize,
    /// Files of the metadata test.
    #[arg(long, default_value_t = 20000)]
    pub files: usize,
    /// Chunk size of new files (bytes; CHFS_CHUNK_SIZE).
    #[arg(long)]
    pub chunk_size: Option<u32>,
    /// Reference directory.
    #[arg(long, default_value = "/dev/shm")]
    pub reference: PathBuf,
    /// Repetitions (the best of each is reported).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Measure only these targets (for profiling one of them); the ratio
    /// needs native and mount.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["reference", "native", "mount"])]
    pub only: Vec<Which>,
    /// Extra chfuse options (e.g. --chfuse-arg=--writeback-cache).
    #[arg(long = "chfuse-arg", allow_hyphen_values = true)]
    pub chfuse_args: Vec<String>,
    /// Start the I/O buffers this many bytes past a page boundary (0: page
    /// aligned, as IOR, dd and fio allocate theirs). Through the mount, a
    /// request whose buffer is not page aligned spans one page more than
    /// its size, and the kernel splits a 1 MiB one into two FUSE requests.
    #[arg(long, default_value_t = 0)]
    pub buffer_offset: usize,
}

/// `len` bytes of `v` starting `skew` bytes past a page boundary.
fn page_slice(v: &mut [u8], len: usize, skew: usize) -> &mut [u8] {
    let off = (PAGE - v.as_ptr() as usize % PAGE) % PAGE + skew % PAGE;
    &mut v[off..off + len]
}
const PAGE: usize = 4096;

/// The targets, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Which {
    /// The reference directory.
    Reference,
    /// The native client.
    Native,
    /// The chfuse mount.
    Mount,
}
const TARGETS: [Which; 3] = [Which::Reference, Which::Native, Which::Mount];

/// Finds `chfuse`: next to the running program, then on `$PATH`.
fn find_chfuse() -> Result<PathBuf> {
    let next = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("chfuse")));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("chfuse"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    next.into_iter()
        .chain(on_path)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            BenchError::Config(
                "chfuse not found next to chfs-bench or on $PATH (cargo build --release -p chfs-fuse)"
                    .into(),
            )
        })
}

/// A chfuse process; unmounted and stopped (by PID) on drop.
struct MountProc {
    mp: PathBuf,
    child: Child,
    _dir: ScratchDir,
}

fn is_mounted(mp: &Path) -> bool {
    let want = mp.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse"))
}

impl MountProc {
    fn start(pool: &LocalPool, chunk: Option<u32>, extra: &[String]) -> Result<Self> {
        let chfuse = find_chfuse()?;
        let dir = ScratchDir::new(
            &std::env::temp_dir(),
            &format!("chfs-bench-fuse-{}", std::process::id()),
        )?;
        let mp = dir.path().join("mnt");
        std::fs::create_dir_all(&mp).map_err(|e| BenchError::io("mkdir", mp.display(), e))?;
        let mut cmd = Command::new(&chfuse);
        cmd.arg(&mp)
            .arg("-f")
            .args(extra)
            .env("CHFS_SERVER", pool.server_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(c) = chunk {
            cmd.env("CHFS_CHUNK_SIZE", c.to_string());
        }
        let spawn_err = |e| BenchError::io("start", chfuse.display(), e);
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let t = Instant::now();
        while !is_mounted(&mp) {
            if let Some(st) = child.try_wait().map_err(spawn_err)? {
                return Err(BenchError::Config(format!("chfuse exited: {st}")));
            }
            if t.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(BenchError::Config("chfuse did not mount".into()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self {
            mp,
            child,
            _dir: dir,
        })
    }
}

impl Drop for MountProc {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.mp).status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mp)
            .status();
    }
}

/// The rates of one target.
#[derive(Default, Clone, Copy, Debug)]
struct Figures {
    write: f64,
    read: f64,
    create: f64,
    stat: f64,
    unlink: f64,
}

impl Figures {
    /// The best of each figure.
    fn best(self, o: Figures) -> Figures {
        Figures {
            write: self.write.max(o.write),
            read: self.read.max(o.read),
            create: self.create.max(o.create),
            stat: self.stat.max(o.stat),
            unlink: self.unlink.max(o.unlink),
        }
    }
}

/// Writes `size` bytes in `block`-sized requests, then fsyncs and closes.
fn write_file(t: &dyn Backend, rel: &str, size: usize, block: &[u8]) -> Result<()> {
    let mut f = t.create(rel)?;
    let mut done = 0;
    while done < size {
        let n = block.len().min(size - done);
        f.pwrite_all(&block[..n], done as u64)?;
        done += n;
    }
    f.fsync()?;
    f.close()
}

/// Reads a file to its end in `buf`-sized requests; returns its length.
fn read_file(t: &dyn Backend, rel: &str, buf: &mut [u8]) -> Result<usize> {
    let mut f = t.open_read(rel)?;
    let mut total = 0;
    loop {
        let n = f.pread(buf, total as u64)?;
        if n == 0 {
            break;
        }
        total += n;
    }
    f.close()?;
    Ok(total)
}

fn run_one(
    t: &dyn Backend,
    name: &str,
    a: &FuseArgs,
    block: &[u8],
    buf: &mut [u8],
) -> Result<Figures> {
    let size = a.size_mib << 20;
    let mib = size as f64 / (1 << 20) as f64;
    let s = Instant::now();
    write_file(t, "seq.bin", size, block)?;
    let write = mib / s.elapsed().as_secs_f64();
    let s = Instant::now();
    let n = read_file(t, "seq.bin", buf)?;
    let read = mib / s.elapsed().as_secs_f64();
    if n != size {
        return Err(BenchError::Check(format!(
            "{name}: read {n} bytes of {size}"
        )));
    }
    t.unlink("seq.bin")?;
    t.mkdir("md")?;
    let names: Vec<String> = (0..a.files).map(|i| format!("md/f{i:06}")).collect();
    let rate = |s: Instant| a.files as f64 / s.elapsed().as_secs_f64();
    let s = Instant::now();
    for n in &names {
        t.create(n)?.close()?;
    }
    let create = rate(s);
    let s = Instant::now();
    for n in &names {
        t.size(n)?;
    }
    let stat = rate(s);
    let s = Instant::now();
    for n in &names {
        t.unlink(n)?;
    }
    let unlink = rate(s);
    t.rmdir("md")?;
    Ok(Figures {
        write,
        read,
        create,
        stat,
        unlink,
    })
}

/// `chfs-bench fuse`.
pub fn run(a: &FuseArgs) -> Result<()> {
    let pool = LocalPool::start_with(PoolOptions {
        servers: a.servers,
        ..Default::default()
    })
    .map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
    // The native client reads the same CHFS_* variables as the mount
    // (CHFS_LOCAL_SOCKET=0 compares both over TCP).
    let env = ClientConfig::from_env().map_err(|e| BenchError::Config(e.to_string()))?;
    let mut cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..env
    };
    if let Some(c) = a.chunk_size {
        cfg.set_chunk_size(c as u64)
            .map_err(|e| BenchError::Config(e.to_string()))?;
    }
    let client = Client::connect(cfg.clone())
        .map_err(|e| BenchError::chfs("connect", &pool.server_string(), e))?;
    let mount = MountProc::start(&pool, a.chunk_size, &a.chfuse_args)?;
    let refdir = ScratchDir::new(
        &a.reference,
        &format!("chfs-bench-fuse-ref-{}", std::process::id()),
    )?;
    let targets: Vec<(String, Box<dyn Backend>)> = vec![
        (
            format!("{} (no FUSE)", a.reference.display()),
            Box::new(PosixBackend::new(refdir.path())),
        ),
        (
            "native client".into(),
            Box::new(ChfsBackend::new(client, "")),
        ),
        (
            "chfuse mount".into(),
            Box::new(PosixBackend::new(&mount.mp)),
        ),
    ];
    let len = a.block_kib << 10;
    let (mut block_mem, mut buf_mem) = (vec![0u8; len + 2 * PAGE], vec![0u8; len + 2 * PAGE]);
    let block = page_slice(&mut block_mem, len, a.buffer_offset);
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let block = &*block;
    let buf = page_slice(&mut buf_mem, len, a.buffer_offset);
    let wanted = |i: usize| a.only.contains(&TARGETS[i]);
    let mut figs = vec![Figures::default(); targets.len()];
    for _ in 0..a.repeat.max(1) {
        for (i, ((name, t), f)) in targets.iter().zip(figs.iter_mut()).enumerate() {
            if wanted(i) {
                *f = f.best(run_one(t.as_ref(), name, a, block, buf)?);
            }
        }
    }
    println!(
        "chfs-bench fuse: {} servers, {} MiB file in {} KiB requests (buffers {} bytes past a page boundary), {} files, chunk size {}, best of {}",
        a.servers,
        a.size_mib,
        a.block_kib,
        a.buffer_offset % PAGE,
        a.files,
        cfg.chunk_size,
        a.repeat.max(1)
    );
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>12} {:>12}",
        "target", "write MiB/s", "read MiB/s", "create op/s", "stat op/s", "unlink op/s"
    );
    for (i, ((name, _), f)) in targets.iter().zip(&figs).enumerate() {
        if !wanted(i) {
            continue;
        }
        println!(
            "{:<28} {:>10.0} {:>10.0} {:>12.0} {:>12.0} {:>12.0}",
            name, f.write, f.read, f.create, f.stat, f.unlink
        );
    }
    let (n, m) = (figs[1], figs[2]);
    if wanted(1) && wanted(2) {
        println!(
            "mount / native: write {:.2}, read {:.2}, create {:.2}, stat {:.2}, unlink {:.2}  (targets: >= 0.70 for I/O, >= 0.50 for metadata)",
            m.write / n.write,
            m.read / n.read,
            m.create / n.create,
            m.stat / n.stat,
            m.unlink / n.unlink
        );
    }
    // The mount goes before the pool, the scratch directories last.
    drop(targets);
    drop(mount);
    drop(pool);
    drop(refdir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_where_asked() {
        let mut v = vec![0u8; 3 * PAGE];
        for skew in [0, 16, PAGE + 5] {
            let s = page_slice(&mut v, PAGE, skew);
            assert_eq!(s.len(), PAGE);
            assert_eq!(s.as_ptr() as usize % PAGE, skew % PAGE);
        }
    }

    /// The workload on a directory (what the reference and the mount
    /// run): figures for every phase, nothing left behind.
    #[test]
    fn the_workload_runs_on_a_directory_and_cleans_up() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: FuseArgs,
        }
        let t = tempfile::tempdir().unwrap();
        let a = Cli::parse_from(["x", "--size-mib", "2", "--files", "10", "--block-kib", "64"]).a;
        assert_eq!(a.only, TARGETS);
        let block = vec![5u8; 64 << 10];
        let mut buf = vec![0u8; 64 << 10];
        let f = run_one(&PosixBackend::new(t.path()), "dir", &a, &block, &mut buf).unwrap();
        assert!(f.write > 0.0 && f.read > 0.0 && f.create > 0.0 && f.stat > 0.0 && f.unlink > 0.0);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }
}
