//! `chfs-bench demo` (what `scripts/demo.sh` runs; formerly the `chfs-demo`
//! program): starts a local pool of chfsd servers, runs a workload through
//! the native client and the same workload on a local directory (default
//! /dev/shm), verifies every byte, and prints throughput, op rates and their
//! ratios. Then stops the pool.
//!
//! Both sides are [`Backend`]s: [`ChfsBackend`] on the pool's root and
//! [`PosixBackend`] on a scratch directory under `--reference`.

use std::path::PathBuf;
use std::time::Instant;

use chfs_client::flags::{O_CREAT, O_RDWR};
use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Args;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{BenchError, Result};
use crate::fs::{Backend, ChfsBackend, PosixBackend};
use crate::score::mib_s;
use crate::scratch::ScratchDir;

/// Options of `chfs-bench demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Number of chfsd servers to start.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub servers: usize,
    /// MiB written and read in the bandwidth phases.
    #[arg(short = 's', long, default_value_t = 512)]
    pub size_mib: usize,
    /// Files created, stat'ed and removed in the metadata phase.
    #[arg(short = 'f', long, default_value_t = 10_000)]
    pub files: usize,
    /// Chunk size in bytes.
    #[arg(short = 'c', long, default_value_t = 1 << 20)]
    pub chunk_size: u32,
    /// Reference directory for the same workload through the kernel.
    #[arg(long, default_value = "/dev/shm")]
    pub reference: PathBuf,
    /// Start the pool without a secret: it is then open to every local and
    /// remote process that can reach its servers (a warning says so). By
    /// default the pool gets a new secret and the demo connects with its
    /// client key.
    #[arg(long = "no-secret")]
    pub no_secret: bool,
}

/// One line of the table: a phase, its unit, and its rate on both sides.
struct Row {
    name: String,
    unit: &'static str,
    chfs: f64,
    reference: f64,
}

/// Position-dependent bytes: a misplaced chunk changes the checksum.
fn fill(off: usize, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (off + i) as u64;
        *b = (x ^ (x >> 8) ^ (x >> 16).wrapping_mul(31)) as u8;
    }
}

/// Writes `total` bytes of [`fill`] in `block`-byte requests to a new
/// file; returns the sum of the blocks' xxh3.
fn write_hashed(t: &dyn Backend, path: &str, block: usize, total: usize) -> Result<u64> {
    let mut f = t.create(path)?;
    let mut buf = vec![0u8; block];
    let mut h = 0u64;
    let mut off = 0;
    while off < total {
        let n = block.min(total - off);
        fill(off, &mut buf[..n]);
        h = h.wrapping_add(xxh3_64(&buf[..n]));
        f.pwrite_all(&buf[..n], off as u64)?;
        off += n;
    }
    f.close()?;
    Ok(h)
}

/// Reads `total` bytes back in `block`-byte requests; returns the sum of
/// the blocks' xxh3.
fn read_hashed(t: &dyn Backend, path: &str, block: usize, total: usize) -> Result<u64> {
    let mut f = t.open_read(path)?;
    let mut buf = vec![0u8; block];
    let mut h = 0u64;
    let mut off = 0;
    while off < total {
        let n = block.min(total - off);
        f.pread_exact(&mut buf[..n], off as u64)?;
        h = h.wrapping_add(xxh3_64(&buf[..n]));
        off += n;
    }
    f.close()?;
    Ok(h)
}

/// Runs the workload on one target; returns (name, unit, value) rows.
fn workload(t: &dyn Backend, a: &DemoArgs) -> Result<Vec<(String, &'static str, f64)>> {
    let total = a.size_mib << 20;
    let mut rows = Vec::new();
    for (label, block) in [("1 MiB", 1usize << 20), ("47,008 B", 47_008)] {
        let path = format!("demo-{block}.dat");
        let s = Instant::now();
        let hw = write_hashed(t, &path, block, total)?;
        rows.push((
            format!("write {label}"),
            "MiB/s",
            mib_s(total as u64, s.elapsed().as_secs_f64()),
        ));
        let size = t.size(&path)?;
        if size != total as u64 {
            return Err(BenchError::Size {
                path,
                got: size,
                want: total as u64,
            });
        }
        let s = Instant::now();
        let hr = read_hashed(t, &path, block, total)?;
        rows.push((
            format!("read {label}"),
            "MiB/s",
            mib_s(total as u64, s.elapsed().as_secs_f64()),
        ));
        if hw != hr {
            return Err(BenchError::Check(format!(
                "{path}: bytes read back differ from bytes written ({label})"
            )));
        }
        t.unlink(&path)?;
    }
    t.mkdir("demo-md")?;
    let names: Vec<String> = (0..a.files)
        .map(|i| format!("demo-md/file.{i:07}"))
        .collect();
    let rate = |s: Instant| a.files as f64 / s.elapsed().as_secs_f64();
    let s = Instant::now();
    for n in &names {
        t.create(n)?.close()?;
    }
    rows.push(("create".into(), "ops/s", rate(s)));
    let s = Instant::now();
    for n in &names {
        let size = t.size(n)?;
        if size != 0 {
            return Err(BenchError::Size {
                path: n.clone(),
                got: size,
                want: 0,
            });
        }
    }
    rows.push(("stat".into(), "ops/s", rate(s)));
    let s = Instant::now();
    for n in &names {
        t.unlink(n)?;
    }
    rows.push(("unlink".into(), "ops/s", rate(s)));
    t.rmdir("demo-md")?;
    Ok(rows)
}

/// Round trips of `stat` on a 4 GiB file with 64 KiB chunks: (size, RPCs).
fn stat_round_trips(c: &Client) -> Result<(u64, u64)> {
    let p = "/big";
    let err = |op| move |e| BenchError::chfs(op, p, e);
    let fd = c
        .open_chunk_size(p, O_RDWR | O_CREAT, 0o644, 64 << 10)
        .map_err(err("create"))?;
    c.pwrite(fd, b"x", (4u64 << 30) - 1)
        .map_err(err("pwrite"))?;
    c.close(fd).map_err(err("close"))?;
    let before = c.stats().rpcs;
    let s = c.stat(p).map_err(err("stat"))?;
    let rpcs = c.stats().rpcs - before;
    c.unlink(p).map_err(err("unlink"))?;
    Ok((s.size, rpcs))
}

/// The warning of `--no-secret`.
const OPEN_POOL_WARNING: &str = "chfs-bench demo: warning: --no-secret: the pool has no secret, so it is open to every local and remote process that can reach its servers: any of them can read, write and delete its files, and stop it";

/// `chfs-bench demo`.
pub fn run(a: &DemoArgs) -> Result<()> {
    let mut opts = PoolOptions {
        servers: a.servers,
        ..Default::default()
    };
    if a.no_secret {
        eprintln!("{OPEN_POOL_WARNING}");
    } else {
        opts = opts.with_new_secret();
    }
    let pool =
        LocalPool::start_with(opts).map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
    println!(
        "chfs-bench demo: {} chfsd servers on loopback: {}",
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
    let base = crate::worker::chfs_config(
        &pool.server_string(),
        &crate::worker::PoolCredential::of(&pool),
    )?;
    let cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        chunk_size: a.chunk_size,
        ..base
    };
    let client =
        Client::connect(cfg).map_err(|e| BenchError::chfs("connect", &pool.server_string(), e))?;
    let refdir = ScratchDir::new(
        &a.reference,
        &format!("chfs-bench-demo-{}", std::process::id()),
    )?;
    println!(
        "workload: {} MiB sequential write+read with 1 MiB and 47,008-byte requests; create/stat/unlink of {} empty files; chunk size {} KiB",
        a.size_mib,
        a.files,
        a.chunk_size / 1024
    );
    let chfs_rows = workload(&ChfsBackend::new(client.clone(), ""), a)?;
    let ref_rows = workload(&PosixBackend::new(refdir.path()), a)?;
    drop(refdir);
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
        a.reference.display().to_string(),
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
    let (size, rpcs) = stat_round_trips(&client)?;
    println!();
    println!(
        "stat of a {} GiB file with 64 KiB chunks: {} round trip(s)",
        size >> 30,
        rpcs
    );
    drop(client);
    pool.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workload on a directory: every phase, nothing left behind.
    #[test]
    fn the_workload_runs_on_a_directory_and_cleans_up() {
        let t = tempfile::tempdir().unwrap();
        let a = DemoArgs {
            servers: 1,
            size_mib: 1,
            files: 20,
            chunk_size: 1 << 20,
            reference: t.path().to_path_buf(),
            no_secret: false,
        };
        let rows = workload(&PosixBackend::new(t.path()), &a).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "write 1 MiB",
                "read 1 MiB",
                "write 47,008 B",
                "read 47,008 B",
                "create",
                "stat",
                "unlink"
            ]
        );
        assert!(rows.iter().all(|r| r.2 > 0.0), "{:?}", names);
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
    }

    /// A misplaced block changes the checksum the demo compares.
    #[test]
    fn the_fill_depends_on_the_position() {
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        fill(0, &mut a);
        fill(1 << 20, &mut b);
        assert_ne!(xxh3_64(&a), xxh3_64(&b));
    }
}
