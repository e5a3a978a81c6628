//! Benchmark: the mount vs the native client vs a local reference
//! directory (default /dev/shm), in one run, on a fresh local pool.
//!
//! - sequential write and read of one file in 1 MiB requests;
//! - create+close, stat and unlink of many empty files.
//!
//! Prints MiB/s and ops/s and the ratio mount / native. Build with
//! `cargo build --release -p chfs-fuse -p chfs-server` and run
//! `target/release/chfuse-bench [--size-mib 2048 --files 20000]`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "chfuse benchmark: mount vs native client vs a local directory")]
struct Args {
    /// Servers in the local pool.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// File size of the sequential test, MiB.
    #[arg(long, default_value_t = 2048)]
    size_mib: usize,
    /// Request size, KiB.
    #[arg(long, default_value_t = 1024)]
    block_kib: usize,
    /// Files of the metadata test.
    #[arg(long, default_value_t = 20000)]
    files: usize,
    /// Chunk size of new files (bytes; CHFS_CHUNK_SIZE).
    #[arg(long)]
    chunk_size: Option<u32>,
    /// Reference directory.
    #[arg(long, default_value = "/dev/shm")]
    reference: PathBuf,
    /// Repetitions (the best of each is reported).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Measure only these targets (for profiling one of them); the ratio
    /// needs native and mount.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["reference", "native", "mount"])]
    only: Vec<Which>,
    /// Extra chfuse options (e.g. --chfuse-arg=--writeback-cache).
    #[arg(long = "chfuse-arg", allow_hyphen_values = true)]
    chfuse_args: Vec<String>,
    /// Start the I/O buffers this many bytes past a page boundary (0: page
    /// aligned, as IOR, dd and fio allocate theirs). Through the mount, a
    /// request whose buffer is not page aligned spans one page more than
    /// its size, and the kernel splits a 1 MiB one into two FUSE requests.
    #[arg(long, default_value_t = 0)]
    buffer_offset: usize,
}

/// `len` bytes of `v` starting `skew` bytes past a page boundary.
fn page_slice(v: &mut [u8], len: usize, skew: usize) -> &mut [u8] {
    let off = (PAGE - v.as_ptr() as usize % PAGE) % PAGE + skew % PAGE;
    &mut v[off..off + len]
}
const PAGE: usize = 4096;

/// The targets, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Which {
    Reference,
    Native,
    Mount,
}
const TARGETS: [Which; 3] = [Which::Reference, Which::Native, Which::Mount];

/// The operations measured, for one target.
trait Target {
    fn name(&self) -> &str;
    fn write_file(&self, rel: &str, size: usize, block: &[u8]) -> std::io::Result<()>;
    fn read_file(&self, rel: &str, buf: &mut [u8]) -> std::io::Result<usize>;
    fn mkdir(&self, rel: &str) -> std::io::Result<()>;
    fn create(&self, rel: &str) -> std::io::Result<()>;
    fn stat(&self, rel: &str) -> std::io::Result<()>;
    fn unlink(&self, rel: &str) -> std::io::Result<()>;
    fn rmdir(&self, rel: &str) -> std::io::Result<()>;
}

struct Posix {
    name: String,
    root: PathBuf,
}

impl Target for Posix {
    fn name(&self) -> &str {
        &self.name
    }
    fn write_file(&self, rel: &str, size: usize, block: &[u8]) -> std::io::Result<()> {
        let mut f = File::create(self.root.join(rel))?;
        let mut done = 0;
        while done < size {
            let n = block.len().min(size - done);
            f.write_all(&block[..n])?;
            done += n;
        }
        f.sync_all()
    }
    fn read_file(&self, rel: &str, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut f = File::open(self.root.join(rel))?;
        let mut total = 0;
        loop {
            let n = f.read(buf)?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }
    fn mkdir(&self, rel: &str) -> std::io::Result<()> {
        std::fs::create_dir(self.root.join(rel))
    }
    fn create(&self, rel: &str) -> std::io::Result<()> {
        File::create(self.root.join(rel)).map(drop)
    }
    fn stat(&self, rel: &str) -> std::io::Result<()> {
        std::fs::metadata(self.root.join(rel)).map(drop)
    }
    fn unlink(&self, rel: &str) -> std::io::Result<()> {
        std::fs::remove_file(self.root.join(rel))
    }
    fn rmdir(&self, rel: &str) -> std::io::Result<()> {
        std::fs::remove_dir(self.root.join(rel))
    }
}

struct Native(Client);

fn io(e: chfs_client::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.errno())
}

impl Target for Native {
    fn name(&self) -> &str {
        "native client"
    }
    fn write_file(&self, rel: &str, size: usize, block: &[u8]) -> std::io::Result<()> {
        let fd = self
            .0
            .create(&format!("/{rel}"), libc::O_WRONLY | libc::O_TRUNC, 0o644)
            .map_err(io)?;
        let mut done = 0;
        while done < size {
            let n = block.len().min(size - done);
            self.0.pwrite(fd, &block[..n], done as u64).map_err(io)?;
            done += n;
        }
        self.0.fsync(fd).map_err(io)?;
        self.0.close(fd).map_err(io)
    }
    fn read_file(&self, rel: &str, buf: &mut [u8]) -> std::io::Result<usize> {
        let fd = self
            .0
            .open(&format!("/{rel}"), libc::O_RDONLY, 0)
            .map_err(io)?;
        let mut total = 0;
        loop {
            let n = self.0.pread(fd, buf, total as u64).map_err(io)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        self.0.close(fd).map_err(io)?;
        Ok(total)
    }
    fn mkdir(&self, rel: &str) -> std::io::Result<()> {
        self.0.mkdir(&format!("/{rel}"), 0o755).map_err(io)
    }
    fn create(&self, rel: &str) -> std::io::Result<()> {
        let fd = self
            .0
            .create(&format!("/{rel}"), libc::O_WRONLY, 0o644)
            .map_err(io)?;
        self.0.close(fd).map_err(io)
    }
    fn stat(&self, rel: &str) -> std::io::Result<()> {
        self.0.stat(&format!("/{rel}")).map(drop).map_err(io)
    }
    fn unlink(&self, rel: &str) -> std::io::Result<()> {
        self.0.unlink(&format!("/{rel}")).map_err(io)
    }
    fn rmdir(&self, rel: &str) -> std::io::Result<()> {
        self.0.rmdir(&format!("/{rel}")).map_err(io)
    }
}

/// A chfuse process; unmounted and stopped (by PID) on drop.
struct MountProc {
    mp: PathBuf,
    child: Child,
    _dir: tempfile_dir::Dir,
}

mod tempfile_dir {
    /// A temporary directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn is_mounted(mp: &Path) -> bool {
    let want = mp.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse"))
}

impl MountProc {
    fn start(pool: &LocalPool, chunk: Option<u32>, extra: &[String]) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let chfuse = exe.with_file_name("chfuse");
        let dir = std::env::temp_dir().join(format!("chfuse-bench-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mnt"))?;
        let mp = dir.join("mnt");
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
        let mut child = cmd.spawn()?;
        let t = Instant::now();
        while !is_mounted(&mp) {
            if let Some(st) = child.try_wait()? {
                return Err(std::io::Error::other(format!("chfuse exited: {st}")));
            }
            if t.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                return Err(std::io::Error::other("chfuse did not mount"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self {
            mp,
            child,
            _dir: tempfile_dir::Dir(dir),
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

#[derive(Default, Clone, Copy)]
struct Figures {
    write: f64,
    read: f64,
    create: f64,
    stat: f64,
    unlink: f64,
}

fn best(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

fn run(t: &dyn Target, a: &Args, block: &[u8], buf: &mut [u8]) -> std::io::Result<Figures> {
    let size = a.size_mib << 20;
    let mib = size as f64 / (1 << 20) as f64;
    let s = Instant::now();
    t.write_file("seq.bin", size, block)?;
    let write = mib / s.elapsed().as_secs_f64();
    let s = Instant::now();
    let n = t.read_file("seq.bin", buf)?;
    let read = mib / s.elapsed().as_secs_f64();
    if n != size {
        return Err(std::io::Error::other(format!(
            "{}: read {n} bytes of {size}",
            t.name()
        )));
    }
    t.unlink("seq.bin")?;
    t.mkdir("md")?;
    let names: Vec<String> = (0..a.files).map(|i| format!("md/f{i:06}")).collect();
    let rate = |s: Instant| a.files as f64 / s.elapsed().as_secs_f64();
    let s = Instant::now();
    for n in &names {
        t.create(n)?;
    }
    let create = rate(s);
    let s = Instant::now();
    for n in &names {
        t.stat(n)?;
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let pool = LocalPool::start_with(PoolOptions {
        servers: a.servers,
        ..Default::default()
    })?;
    // The native client reads the same CHFS_* variables as the mount
    // (CHFS_LOCAL_SOCKET=0 compares both over TCP).
    let mut cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..ClientConfig::from_env()?
    };
    if let Some(c) = a.chunk_size {
        cfg.set_chunk_size(c as u64)?;
    }
    let native = Native(Client::connect(cfg.clone())?);
    let mount = MountProc::start(&pool, a.chunk_size, &a.chfuse_args)?;
    let refdir = a
        .reference
        .join(format!("chfuse-bench-ref-{}", std::process::id()));
    std::fs::create_dir_all(&refdir)?;
    let _ref_guard = tempfile_dir::Dir(refdir.clone());
    let targets: Vec<Box<dyn Target>> = vec![
        Box::new(Posix {
            name: format!("{} (no FUSE)", a.reference.display()),
            root: refdir,
        }),
        Box::new(native),
        Box::new(Posix {
            name: "chfuse mount".into(),
            root: mount.mp.clone(),
        }),
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
        for (i, (t, f)) in targets.iter().zip(figs.iter_mut()).enumerate() {
            if !wanted(i) {
                continue;
            }
            let r = run(t.as_ref(), &a, block, buf)?;
            f.write = best(f.write, r.write);
            f.read = best(f.read, r.read);
            f.create = best(f.create, r.create);
            f.stat = best(f.stat, r.stat);
            f.unlink = best(f.unlink, r.unlink);
        }
    }
    println!(
        "chfuse-bench: {} servers, {} MiB file in {} KiB requests (buffers {} bytes past a page boundary), {} files, chunk size {}, best of {}",
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
    for (i, (t, f)) in targets.iter().zip(&figs).enumerate() {
        if !wanted(i) {
            continue;
        }
        println!(
            "{:<28} {:>10.0} {:>10.0} {:>12.0} {:>12.0} {:>12.0}",
            t.name(),
            f.write,
            f.read,
            f.create,
            f.stat,
            f.unlink
        );
    }
    let (n, m) = (figs[1], figs[2]);
    if !(wanted(1) && wanted(2)) {
        return Ok(());
    }
    println!(
        "mount / native: write {:.2}, read {:.2}, create {:.2}, stat {:.2}, unlink {:.2}  (targets: >= 0.70 for I/O, >= 0.50 for metadata)",
        m.write / n.write,
        m.read / n.read,
        m.create / n.create,
        m.stat / n.stat,
        m.unlink / n.unlink
    );
    drop(targets);
    drop(mount);
    Ok(())
}
