//! chfs-demo: starts a local pool of chfsd servers, runs a workload through
//! the native client and the same workload on a local directory (default
//! /dev/shm), verifies every byte, and prints throughput, op rates and their
//! ratios. Then stops the pool.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use chfs_client::flags::*;
use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Parser;
use xxhash_rust::xxh3::xxh3_64;

/// Run the chfs-rs demo workload on a local pool and on a reference directory.
#[derive(Parser)]
#[command(name = "chfs-demo", version)]
struct Args {
    /// Number of chfsd servers to start.
    #[arg(short = 'n', long, default_value_t = 4)]
    servers: usize,
    /// MiB written and read in the bandwidth phases.
    #[arg(short = 's', long, default_value_t = 512)]
    size_mib: usize,
    /// Files created, stat'ed and removed in the metadata phase.
    #[arg(short = 'f', long, default_value_t = 10_000)]
    files: usize,
    /// Chunk size in bytes.
    #[arg(short = 'c', long, default_value_t = 1 << 20)]
    chunk_size: u32,
    /// Reference directory for the same workload through the kernel.
    #[arg(long, default_value = "/dev/shm")]
    reference: PathBuf,
    /// Start the pool without a secret: it is then open to every local and
    /// remote process that can reach its servers (a warning says so). By
    /// default the pool gets a new secret and the demo connects with its
    /// client key.
    #[arg(long = "no-secret")]
    no_secret: bool,
}

struct Row {
    name: String,
    unit: &'static str,
    chfs: f64,
    reference: f64,
}

/// The workload, written once against a small file-system interface.
trait Target {
    fn create_write(
        &self,
        path: &str,
        block: usize,
        total: usize,
        fill: &dyn Fn(usize, &mut [u8]),
    ) -> u64;
    fn read_all(&self, path: &str, block: usize, total: usize) -> u64;
    fn mkdir(&self, path: &str);
    fn touch(&self, path: &str);
    fn stat_size(&self, path: &str) -> u64;
    fn unlink(&self, path: &str);
    fn rmdir(&self, path: &str);
}

struct Chfs(Client);

impl Target for Chfs {
    fn create_write(
        &self,
        path: &str,
        block: usize,
        total: usize,
        fill: &dyn Fn(usize, &mut [u8]),
    ) -> u64 {
        let c = &self.0;
        let fd = c.create(path, O_WRONLY | O_TRUNC, 0o644).expect("create");
        let mut buf = vec![0u8; block];
        let mut h = 0u64;
        let mut off = 0;
        while off < total {
            let n = block.min(total - off);
            fill(off, &mut buf[..n]);
            h = h.wrapping_add(xxh3_64(&buf[..n]));
            assert_eq!(c.pwrite(fd, &buf[..n], off as u64).expect("pwrite"), n);
            off += n;
        }
        c.close(fd).expect("close");
        h
    }
    fn read_all(&self, path: &str, block: usize, total: usize) -> u64 {
        let c = &self.0;
        let fd = c.open(path, O_RDONLY, 0).expect("open");
        let mut buf = vec![0u8; block];
        let mut h = 0u64;
        let mut off = 0;
        while off < total {
            let n = block.min(total - off);
            assert_eq!(
                c.pread(fd, &mut buf[..n], off as u64).expect("pread"),
                n,
                "short read"
            );
            h = h.wrapping_add(xxh3_64(&buf[..n]));
            off += n;
        }
        c.close(fd).expect("close");
        h
    }
    fn mkdir(&self, path: &str) {
        self.0.mkdir(path, 0o755).expect("mkdir");
    }
    fn touch(&self, path: &str) {
        let fd = self
            .0
            .create(path, O_WRONLY | O_EXCL, 0o644)
            .expect("create");
        self.0.close(fd).expect("close");
    }
    fn stat_size(&self, path: &str) -> u64 {
        self.0.stat(path).expect("stat").size
    }
    fn unlink(&self, path: &str) {
        self.0.unlink(path).expect("unlink");
    }
    fn rmdir(&self, path: &str) {
        self.0.rmdir(path).expect("rmdir");
    }
}

struct Posix(PathBuf);

impl Posix {
    fn p(&self, path: &str) -> PathBuf {
        self.0.join(path.trim_start_matches('/'))
    }
}

impl Target for Posix {
    fn create_write(
        &self,
        path: &str,
        block: usize,
        total: usize,
        fill: &dyn Fn(usize, &mut [u8]),
    ) -> u64 {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.p(path))
            .expect("create");
        let mut buf = vec![0u8; block];
        let mut h = 0u64;
        let mut off = 0;
        while off < total {
            let n = block.min(total - off);
            fill(off, &mut buf[..n]);
            h = h.wrapping_add(xxh3_64(&buf[..n]));
            f.write_all_at(&buf[..n], off as u64).expect("pwrite");
            off += n;
        }
        h
    }
    fn read_all(&self, path: &str, block: usize, total: usize) -> u64 {
        let f = File::open(self.p(path)).expect("open");
        let mut buf = vec![0u8; block];
        let mut h = 0u64;
        let mut off = 0;
        while off < total {
            let n = block.min(total - off);
            f.read_exact_at(&mut buf[..n], off as u64).expect("pread");
            h = h.wrapping_add(xxh3_64(&buf[..n]));
            off += n;
        }
        h
    }
    fn mkdir(&self, path: &str) {
        fs::create_dir(self.p(path)).expect("mkdir");
    }
    fn touch(&self, path: &str) {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.p(path))
            .expect("create");
    }
    fn stat_size(&self, path: &str) -> u64 {
        fs::metadata(self.p(path)).expect("stat").len()
    }
    fn unlink(&self, path: &str) {
        fs::remove_file(self.p(path)).expect("unlink");
    }
    fn rmdir(&self, path: &str) {
        fs::remove_dir(self.p(path)).expect("rmdir");
    }
}

fn fill(off: usize, buf: &mut [u8]) {
    // Position-dependent bytes: a misplaced chunk changes the checksum.
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (off + i) as u64;
        *b = (x ^ (x >> 8) ^ (x >> 16).wrapping_mul(31)) as u8;
    }
}

fn mib_s(bytes: usize, t: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / t
}

/// Runs the workload on one target; returns (name, unit, value) rows.
fn workload(t: &dyn Target, a: &Args) -> Vec<(String, &'static str, f64)> {
    let total = a.size_mib << 20;
    let mut rows = Vec::new();
    for (label, block) in [("1 MiB", 1usize << 20), ("47,008 B", 47_008)] {
        let path = format!("/demo-{block}.dat");
        let s = Instant::now();
        let hw = t.create_write(&path, block, total, &fill);
        rows.push((
            format!("write {label}"),
            "MiB/s",
            mib_s(total, s.elapsed().as_secs_f64()),
        ));
        assert_eq!(t.stat_size(&path), total as u64, "size after write");
        let s = Instant::now();
        let hr = t.read_all(&path, block, total);
        rows.push((
            format!("read {label}"),
            "MiB/s",
            mib_s(total, s.elapsed().as_secs_f64()),
        ));
        assert_eq!(
            hw, hr,
            "bytes read back differ from bytes written ({label})"
        );
        t.unlink(&path);
    }
    t.mkdir("/demo-md");
    let names: Vec<String> = (0..a.files)
        .map(|i| format!("/demo-md/file.{i:07}"))
        .collect();
    let s = Instant::now();
    for n in &names {
        t.touch(n);
    }
    rows.push((
        "create".into(),
        "ops/s",
        a.files as f64 / s.elapsed().as_secs_f64(),
    ));
    let s = Instant::now();
    for n in &names {
        assert_eq!(t.stat_size(n), 0);
    }
    rows.push((
        "stat".into(),
        "ops/s",
        a.files as f64 / s.elapsed().as_secs_f64(),
    ));
    let s = Instant::now();
    for n in &names {
        t.unlink(n);
    }
    rows.push((
        "unlink".into(),
        "ops/s",
        a.files as f64 / s.elapsed().as_secs_f64(),
    ));
    t.rmdir("/demo-md");
    rows
}

/// Round trips of `stat` on a 4 GiB file with 64 KiB chunks.
fn stat_round_trips(c: &Client) -> (u64, u64) {
    let fd = c
        .open_chunk_size("/big", O_RDWR | O_CREAT, 0o644, 64 << 10)
        .expect("create");
    c.pwrite(fd, b"x", (4u64 << 30) - 1).expect("pwrite");
    c.close(fd).expect("close");
    let before = c.stats().rpcs;
    let s = c.stat("/big").expect("stat");
    let rpcs = c.stats().rpcs - before;
    c.unlink("/big").expect("unlink");
    (s.size, rpcs)
}

fn main() {
    let a = Args::parse();
    let mut opts = PoolOptions {
        servers: a.servers,
        ..Default::default()
    };
    if a.no_secret {
        eprintln!("chfs-demo: warning: --no-secret: the pool has no secret, so it is open to every local and remote process that can reach its servers: any of them can read, write and delete its files, and stop it");
    } else {
        opts = opts.with_new_secret();
    }
    let pool = match LocalPool::start_with(opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chfs-demo: cannot start the pool: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "chfs-demo: {} chfsd servers on loopback: {}",
        pool.addrs().len(),
        pool.server_string()
    );
    if let Some(k) = pool.client_key_file() {
        println!(
            "pool secret on: the demo connects with the client key {}",
            k.display()
        );
    }
    // Other CHFS_* client variables apply (e.g. CHFS_LOCAL_SOCKET=0); the
    // credential is the pool's client key (none for --no-secret).
    let key = pool.client_key_file();
    let base = match ClientConfig::from_lookup(|k| match k {
        "CHFS_SECRET_FILE" => key.as_ref().map(|p| p.display().to_string()),
        "CHFS_SECRET" => None,
        _ => std::env::var(k).ok(),
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chfs-demo: {e}");
            std::process::exit(2);
        }
    };
    let cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        chunk_size: a.chunk_size,
        ..base
    };
    let client = match Client::connect(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chfs-demo: cannot connect: {e}");
            std::process::exit(1);
        }
    };
    let refdir = a
        .reference
        .join(format!("chfs-demo-{}", std::process::id()));
    if let Err(e) = fs::create_dir_all(&refdir) {
        eprintln!("chfs-demo: cannot create {}: {e}", refdir.display());
        std::process::exit(1);
    }
    println!(
        "workload: {} MiB sequential write+read with 1 MiB and 47,008-byte requests; create/stat/unlink of {} empty files; chunk size {} KiB",
        a.size_mib,
        a.files,
        a.chunk_size / 1024
    );
    let chfs_rows = workload(&Chfs(client.clone()), &a);
    let ref_rows = workload(&Posix(refdir.clone()), &a);
    let _ = fs::remove_dir_all(&refdir);
    let rows: Vec<Row> = chfs_rows
        .into_iter()
        .zip(ref_rows)
        .map(|((name, unit, chfs), (_, _, reference))| Row {
            name,
            unit,
            chfs,
            reference,
        })
        .collect();
    println!("all bytes verified (xxh3 of every block written == read back)");
    println!();
    println!(
        "{:<18} {:>14} {:>14} {:>8}",
        "phase",
        "chfs-rs",
        short(&a.reference),
        "ratio"
    );
    for r in &rows {
        println!(
            "{:<18} {:>9.0} {:<5}{:>9.0} {:<5}{:>7.2}x",
            r.name,
            r.chfs,
            r.unit,
            r.reference,
            r.unit,
            r.chfs / r.reference
        );
    }
    let (size, rpcs) = stat_round_trips(&client);
    println!();
    println!(
        "stat of a {} GiB file with 64 KiB chunks: {} round trip(s)",
        size >> 30,
        rpcs
    );
    pool.stop();
}

fn short(p: &Path) -> String {
    p.display().to_string()
}
