//! chfs-cache-bench: cache-mode figures, each next to a reference measured
//! in the same run:
//!
//! 1. stage-in of a backend tree (chstagein's parallel fetch) vs `cp -r` of
//!    the same tree;
//! 2. write-back of a new tree (write through the client, then `chfs_sync`)
//!    vs `cp -r`;
//! 3. I/O-aware flushing: foreground write bandwidth while dirty data waits
//!    (default idle flushing) vs with flushing disabled, and how many dirty
//!    chunks the flusher wrote meanwhile; plus flushing at once (no
//!    I/O-awareness) for contrast.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Parser;

/// Cache-mode benchmark: stage-in, write-back and I/O-aware flushing.
#[derive(Parser)]
#[command(name = "chfs-cache-bench", version)]
struct Args {
    /// Servers in the pool.
    #[arg(short = 'n', long, default_value_t = 4)]
    servers: usize,
    /// Files in the staged / written trees.
    #[arg(long, default_value_t = 32)]
    files: usize,
    /// MiB per file.
    #[arg(long, default_value_t = 16)]
    file_mib: usize,
    /// MiB written in the foreground phase of the I/O-aware test.
    #[arg(long, default_value_t = 1024)]
    foreground_mib: usize,
    /// Directory for the backend trees (a disk-backed directory models a
    /// parallel file system better than tmpfs).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Chunk size.
    #[arg(long, default_value_t = 1 << 20)]
    chunk_size: u32,
}

fn pool(a: &Args, backend: &Path, idle: &str) -> (LocalPool, Client) {
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
    .expect("start pool");
    let c = Client::connect(ClientConfig {
        servers: p.addrs().to_vec(),
        chunk_size: a.chunk_size,
        ..Default::default()
    })
    .expect("connect");
    (p, c)
}

fn write_file(c: &Client, path: &str, mib: usize, seed: u8) {
    let fd = c
        .create(path, libc::O_WRONLY | libc::O_TRUNC, 0o644)
        .expect("create");
    let mut buf = vec![seed; 1 << 20];
    for i in 0..mib {
        buf[0] = i as u8;
        c.pwrite(fd, &buf, (i << 20) as u64).expect("write");
    }
    c.close(fd).expect("close");
}

fn cp_r(from: &Path, to: &Path) -> f64 {
    let _ = std::fs::remove_dir_all(to);
    let s = Instant::now();
    let ok = Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "cp -r failed");
    sync_fs();
    s.elapsed().as_secs_f64()
}

fn sync_fs() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

fn mib_s(mib: usize, t: f64) -> f64 {
    mib as f64 / t
}

fn main() {
    let a = Args::parse();
    let root = a
        .dir
        .join(format!("chfs-cache-bench-{}", std::process::id()));
    let backend = root.join("backend");
    std::fs::create_dir_all(backend.join("input")).expect("create bench dir");
    let total = a.files * a.file_mib;
    println!(
        "chfs-cache-bench: {} servers, {} files x {} MiB, chunk {} KiB, backend under {}",
        a.servers,
        a.files,
        a.file_mib,
        a.chunk_size >> 10,
        root.display()
    );
    let block = vec![7u8; a.file_mib << 20];
    for i in 0..a.files {
        std::fs::write(backend.join(format!("input/f{i:04}")), &block).expect("make input");
    }
    sync_fs();

    // 1. stage-in vs cp -r
    let (p, c) = pool(&a, &backend, "1000");
    let paths: Vec<String> = (0..a.files).map(|i| format!("/input/f{i:04}")).collect();
    let s = Instant::now();
    let r = chfs_ctl::stage::stagein(&c, &paths, 8);
    let t_stage = s.elapsed().as_secs_f64();
    assert!(
        r.failures.is_empty(),
        "stage-in failed: {:?}",
        r.failures.first()
    );
    let t_cp_in = cp_r(&backend.join("input"), &root.join("copy-in"));
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
    c.mkdir("/output", 0o755).expect("mkdir");
    let s = Instant::now();
    for i in 0..a.files {
        write_file(&c, &format!("/output/f{i:04}"), a.file_mib, 3);
    }
    let t_write = s.elapsed().as_secs_f64();
    let s = Instant::now();
    c.sync().expect("sync");
    sync_fs();
    let t_flush = s.elapsed().as_secs_f64();
    let t_cp_out = cp_r(&backend.join("output"), &root.join("copy-out"));
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
        let b = root.join(format!("backend-{}", results.len()));
        std::fs::create_dir_all(&b).expect("mkdir");
        let (p, c) = pool(&a, &b, idle);
        c.mkdir("/dirty", 0o755).expect("mkdir");
        for i in 0..a.files {
            write_file(&c, &format!("/dirty/f{i:04}"), a.file_mib, 5);
        }
        let before = c.flush_status("/dirty").expect("status").chunks;
        let s = Instant::now();
        let per = a.foreground_mib.div_ceil(8).max(1);
        for i in 0..8 {
            write_file(&c, &format!("/fg{i}"), per, 9);
        }
        let t = s.elapsed().as_secs_f64();
        let after = c.flush_status("/dirty").expect("status").chunks;
        let bw = mib_s(per * 8, t);
        println!(
            "  {:<34} foreground {:>6.0} MiB/s; dirty chunks flushed meanwhile: {} of {}",
            label,
            bw,
            before - after.min(before),
            before
        );
        results.push(bw);
        drop(c);
        p.stop();
    }
    println!("  foreground bandwidth with idle flushing = {:.1}% of flushing disabled; flushing at once = {:.1}%", 100.0 * results[1] / results[0], 100.0 * results[2] / results[0]);
    let _ = std::fs::remove_dir_all(&root);
}
