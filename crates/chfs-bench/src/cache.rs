//! `chfs-bench cache` (formerly the `chfs-cache-bench` program): cache-mode
//! figures, each next to a reference measured in the same run:
//!
//! 1. stage-in of a backend tree (chstagein's parallel fetch) vs `cp -r` of
//!    the same tree;
//! 2. write-back of a new tree (write through the client, then `chfs_sync`)
//!    vs `cp -r`;
//! 3. I/O-aware flushing: foreground write bandwidth while dirty data waits
//!    (default idle flushing) vs with flushing disabled, and how many dirty
//!    chunks the flusher wrote meanwhile; plus flushing at once (no
//!    I/O-awareness) for contrast.
//!
//! Files are written through a [`ChfsBackend`]; staging, syncing and the
//! flush status are cache-mode calls of the client.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Args;

use crate::error::{BenchError, Result};
use crate::fs::{Backend, ChfsBackend};
use crate::scratch::ScratchDir;

/// Options of `chfs-bench cache`.
#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Servers in the pool.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub servers: usize,
    /// Files in the staged / written trees.
    #[arg(long, default_value_t = 32)]
    pub files: usize,
    /// MiB per file.
    #[arg(long, default_value_t = 16)]
    pub file_mib: usize,
    /// MiB written in the foreground phase of the I/O-aware test.
    #[arg(long, default_value_t = 1024)]
    pub foreground_mib: usize,
    /// Directory for the backend trees (a disk-backed directory models a
    /// parallel file system better than tmpfs).
    #[arg(long, default_value = "/tmp")]
    pub dir: PathBuf,
    /// Chunk size.
    #[arg(long, default_value_t = 1 << 20)]
    pub chunk_size: u32,
}

/// A pool in cache mode over `backend`, flushing after `idle` ms without
/// requests, and a client of it.
fn pool(a: &CacheArgs, backend: &Path, idle: &str) -> Result<(LocalPool, Client)> {
    let args = vec![
        "--backend".into(),
        backend.display().to_string(),
        "--flush-idle-msec".into(),
        idle.into(),
        "--chunk-size".into(),
        a.chunk_size.to_string(),
    ];
    let p = LocalPool::start_with(PoolOptions {
        servers: a.servers,
        args,
        ..Default::default()
    })
    .map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
    let c = Client::connect(ClientConfig {
        servers: p.addrs().to_vec(),
        chunk_size: a.chunk_size,
        ..Default::default()
    })
    .map_err(|e| BenchError::chfs("connect", &p.server_string(), e))?;
    Ok((p, c))
}

/// Writes `mib` MiB of `seed` bytes (each MiB stamped with its index).
fn write_file(b: &dyn Backend, path: &str, mib: usize, seed: u8) -> Result<()> {
    let mut f = b.create(path)?;
    let mut buf = vec![seed; 1 << 20];
    for i in 0..mib {
        buf[0] = i as u8;
        f.pwrite_all(&buf, (i << 20) as u64)?;
    }
    f.close()
}

fn cp_r(from: &Path, to: &Path) -> Result<f64> {
    let _ = std::fs::remove_dir_all(to);
    let s = Instant::now();
    let ok = Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        return Err(BenchError::Check(format!(
            "cp -r {} {} failed",
            from.display(),
            to.display()
        )));
    }
    sync_fs();
    Ok(s.elapsed().as_secs_f64())
}

fn sync_fs() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn mib_s(mib: usize, t: f64) -> f64 {
    mib as f64 / t
}

fn flush_status(c: &Client, path: &str) -> Result<u64> {
    c.flush_status(path)
        .map(|s| s.chunks)
        .map_err(|e| BenchError::chfs("flush status", path, e))
}

/// `chfs-bench cache`.
pub fn run(a: &CacheArgs) -> Result<()> {
    let scratch = ScratchDir::new(&a.dir, &format!("chfs-bench-cache-{}", std::process::id()))?;
    let root = scratch.path();
    let backend = root.join("backend");
    let input = backend.join("input");
    std::fs::create_dir_all(&input).map_err(|e| BenchError::io("mkdir", input.display(), e))?;
    let total = a.files * a.file_mib;
    println!(
        "chfs-bench cache: {} servers, {} files x {} MiB, chunk {} KiB, backend under {}",
        a.servers,
        a.files,
        a.file_mib,
        a.chunk_size >> 10,
        root.display()
    );
    let block = vec![7u8; a.file_mib << 20];
    for i in 0..a.files {
        let p = input.join(format!("f{i:04}"));
        std::fs::write(&p, &block).map_err(|e| BenchError::io("write", p.display(), e))?;
    }
    sync_fs();

    // 1. stage-in vs cp -r
    let (p, c) = pool(a, &backend, "1000")?;
    let b = ChfsBackend::new(c.clone(), "");
    let paths: Vec<String> = (0..a.files).map(|i| format!("/input/f{i:04}")).collect();
    let s = Instant::now();
    let r = chfs_ctl::stage::stagein(&c, &paths, 8);
    let t_stage = s.elapsed().as_secs_f64();
    if let Some(f) = r.failures.first() {
        return Err(BenchError::Check(format!("stage-in failed: {f:?}")));
    }
    let t_cp_in = cp_r(&input, &root.join("copy-in"))?;
    println!();
    println!(
        "{:<44} {:>10} {:>10} {:>7}",
        "phase", "chfs-rs", "cp -r", "ratio"
    );
    println!(
        "{:<44} {:>6.0} MiB/s {:>6.0} MiB/s {:>6.2}x",
        "stage-in (backend -> cache)",
        mib_s(total, t_stage),
        mib_s(total, t_cp_in),
        t_cp_in / t_stage
    );

    // 2. write-back: write a new tree, chfs_sync, vs cp -r of the same tree
    b.mkdir("output")?;
    let s = Instant::now();
    for i in 0..a.files {
        write_file(&b, &format!("output/f{i:04}"), a.file_mib, 3)?;
    }
    let t_write = s.elapsed().as_secs_f64();
    let s = Instant::now();
    c.sync().map_err(|e| BenchError::chfs("sync", "/", e))?;
    sync_fs();
    let t_flush = s.elapsed().as_secs_f64();
    let t_cp_out = cp_r(&backend.join("output"), &root.join("copy-out"))?;
    println!(
        "{:<44} {:>6.0} MiB/s {:>6.0} MiB/s {:>6.2}x",
        "write-back (chfs_sync after writing)",
        mib_s(total, t_flush),
        mib_s(total, t_cp_out),
        t_cp_out / t_flush
    );
    println!(
        "{:<44} {:>6.0} MiB/s",
        "  (foreground writes into the cache)",
        mib_s(total, t_write)
    );
    drop(b);
    drop(c);
    p.stop();

    // 3. I/O-aware flushing: dirty data waits while the client writes.
    println!();
    println!(
        "I/O-aware flushing: {} MiB dirty in the cache, then {} MiB written in the foreground",
        total, a.foreground_mib
    );
    let mut results = Vec::new();
    for (label, idle) in [
        ("flushing disabled", "3600000"),
        ("idle flushing (1 s, default)", "1000"),
        ("flush at once (not I/O-aware)", "-1"),
    ] {
        let bdir = root.join(format!("backend-{}", results.len()));
        std::fs::create_dir_all(&bdir).map_err(|e| BenchError::io("mkdir", bdir.display(), e))?;
        let (p, c) = pool(a, &bdir, idle)?;
        let b = ChfsBackend::new(c.clone(), "");
        b.mkdir("dirty")?;
        for i in 0..a.files {
            write_file(&b, &format!("dirty/f{i:04}"), a.file_mib, 5)?;
        }
        let before = flush_status(&c, "/dirty")?;
        let s = Instant::now();
        let per = a.foreground_mib.div_ceil(8).max(1);
        for i in 0..8 {
            write_file(&b, &format!("fg{i}"), per, 9)?;
        }
        let t = s.elapsed().as_secs_f64();
        let after = flush_status(&c, "/dirty")?;
        let bw = mib_s(per * 8, t);
        println!(
            "  {:<34} foreground {:>6.0} MiB/s; dirty chunks flushed meanwhile: {} of {}",
            label,
            bw,
            before - after.min(before),
            before
        );
        results.push(bw);
        drop(b);
        drop(c);
        p.stop();
    }
    println!("  foreground bandwidth with idle flushing = {:.1}% of flushing disabled; flushing at once = {:.1}%", 100.0 * results[1] / results[0], 100.0 * results[2] / results[0]);
    Ok(())
}
