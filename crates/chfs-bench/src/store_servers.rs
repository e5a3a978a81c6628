//! The storage engines measured through real `chfsd` servers, what a
//! client sees (formerly `examples/server_bench.rs` of chfs-store):
//!
//! - `chfs-bench store-servers`: one server per engine (mem, pmem on
//!   /dev/shm, posix on /dev/shm, posix on the temp directory), alternating
//!   rounds; a client writes and reads a `--mib` MiB file (1 MiB chunks,
//!   4 MiB requests, fsync), then creates, stats and removes `--files`
//!   empty files. Prints the medians and the ratio to the mem engine of the
//!   same run.
//! - `chfs-bench store-rss`: one POSIX-engine server with its store in
//!   `--dir` (default the temp directory); `--gib` GiB are written (1 MiB
//!   chunks, 256 MiB files, fsync), read back, checked and removed; the
//!   server's VmRSS is sampled throughout.
//!
//! The client side is a [`ChfsBackend`]; each server is a one-server
//! [`LocalPool`] whose store lies in a scratch directory of the medium
//! measured.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Args;

use crate::error::{BenchError, Result};
use crate::fs::{Backend, ChfsBackend};
use crate::score::median;
use crate::scratch::ScratchDir;

/// Options of `chfs-bench store-servers`.
#[derive(Args, Debug, Clone)]
pub struct ServersArgs {
    /// MiB written and read through each server.
    #[arg(long, default_value_t = 256)]
    pub mib: usize,
    /// Empty files created, stat'ed and removed.
    #[arg(long, default_value_t = 5000)]
    pub files: usize,
    /// Rounds (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = crate::store::at_least_one)]
    pub rounds: usize,
}

/// Options of `chfs-bench store-rss`.
#[derive(Args, Debug, Clone)]
pub struct RssArgs {
    /// GiB written, read back and removed.
    #[arg(long, default_value_t = 10)]
    pub gib: u64,
    /// Directory of the server's store (default: the temp directory).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// One chfsd with the engine `store` (its store in a scratch directory
/// under `parent`, of `size`), and a client of it with 1 MiB chunks.
struct Server {
    client: Client,
    pool: LocalPool,
    _dir: ScratchDir,
}

impl Server {
    fn start(store: &str, parent: &Path, size: &str, tag: &str) -> Result<Self> {
        let dir = ScratchDir::new(
            parent,
            &format!("chfs-bench-store-servers-{}-{tag}", std::process::id()),
        )?;
        let path = match store {
            "pmem" => dir.path().join("s.pmem"),
            _ => dir.path().join("s"),
        };
        let pool = LocalPool::start_with(PoolOptions {
            servers: 1,
            args: vec![
                "--store".into(),
                store.into(),
                "--size".into(),
                size.into(),
                "--path".into(),
                path.display().to_string(),
            ],
            ..Default::default()
        })
        .map_err(|e| BenchError::io("start chfsd", "chfsd", e))?;
        let client = Client::connect(ClientConfig {
            servers: pool.addrs().to_vec(),
            rpc_timeout: Duration::from_secs(60),
            ..Default::default()
        })
        .map_err(|e| BenchError::chfs("connect", &pool.server_string(), e))?;
        client
            .set_chunk_size(1 << 20)
            .map_err(|e| BenchError::chfs("set chunk size", "", e))?;
        Ok(Server {
            client,
            pool,
            _dir: dir,
        })
    }

    fn backend(&self) -> ChfsBackend {
        ChfsBackend::new(self.client.clone(), "")
    }
}

use crate::scale::rss_kib;

/// One round on one server: write, read MiB/s, create, stat, unlink op/s.
fn round(b: &dyn Backend, mib: usize, files: usize, block: &[u8]) -> Result<[f64; 5]> {
    let t0 = Instant::now();
    let mut f = b.create("big")?;
    let mut off = 0u64;
    while off < (mib as u64) << 20 {
        f.pwrite_all(block, off)?;
        off += block.len() as u64;
    }
    f.fsync()?;
    f.close()?;
    let w = off as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
    let t0 = Instant::now();
    let mut f = b.open_read("big")?;
    let mut buf = vec![0u8; block.len()];
    let mut got = 0u64;
    while got < off {
        let n = f.pread(&mut buf, got)?;
        if n == 0 {
            return Err(BenchError::ShortRead {
                path: "big".into(),
                off: got,
                got: 0,
                want: block.len(),
            });
        }
        got += n as u64;
    }
    f.close()?;
    let r = got as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
    b.unlink("big")?;
    b.mkdir("m")?;
    let names: Vec<String> = (0..files).map(|k| format!("m/f{k}")).collect();
    let rate = |t0: Instant| files as f64 / t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for n in &names {
        b.create(n)?.close()?;
    }
    let cr = rate(t0);
    let t0 = Instant::now();
    for n in &names {
        b.size(n)?;
    }
    let st = rate(t0);
    let t0 = Instant::now();
    for n in &names {
        b.unlink(n)?;
    }
    let rm = rate(t0);
    Ok([w, r, cr, st, rm])
}

/// `chfs-bench store-servers`.
pub fn engines(a: &ServersArgs) -> Result<()> {
    let shm = PathBuf::from("/dev/shm");
    let disk = std::env::temp_dir();
    let list: Vec<(&str, String, PathBuf)> = vec![
        ("mem", "mem".into(), disk.clone()),
        ("pmem", format!("pmem ({})", shm.display()), shm.clone()),
        ("posix", format!("posix ({})", shm.display()), shm.clone()),
        ("posix", format!("posix ({})", disk.display()), disk.clone()),
    ];
    let block: Vec<u8> = (0..(4usize << 20)).map(|i| (i * 7) as u8).collect();
    let mut res: Vec<Vec<[f64; 5]>> = list.iter().map(|_| Vec::new()).collect();
    let size = format!("{}M", a.mib * 2 + 64 + a.files / 512);
    for _ in 0..a.rounds {
        for (i, (store, _, dir)) in list.iter().enumerate() {
            let s = Server::start(
                store,
                dir,
                if *store == "pmem" { &size } else { "0" },
                &i.to_string(),
            )?;
            res[i].push(round(&s.backend(), a.mib, a.files, &block)?);
        }
    }
    println!(
        "through chfsd (1 server, 1 client, loopback): {} MiB file in 1 MiB chunks + fsync, {} files, {} rounds (median)",
        a.mib, a.files, a.rounds
    );
    let heads = [
        "write MiB/s",
        "read MiB/s",
        "create/s",
        "stat/s",
        "unlink/s",
    ];
    print!("{:<22}", "engine");
    for h in heads {
        print!("{h:>18}");
    }
    println!();
    let med = |i: usize, k: usize| median(res[i].iter().map(|f| f[k]).collect());
    for (i, (_, name, _)) in list.iter().enumerate() {
        print!("{name:<22}");
        for k in 0..5 {
            let v = med(i, k);
            print!("{:>18}", format!("{v:.0} ({:.0}%)", 100.0 * v / med(0, k)));
        }
        println!();
    }
    println!("(percentages: ratio to the mem engine measured in the same run)");
    Ok(())
}

/// `chfs-bench store-rss`.
pub fn rss(a: &RssArgs) -> Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let s = Server::start("posix", &dir, "0", "rss")?;
    let b = s.backend();
    let pid = s
        .pool
        .pid(0)
        .ok_or_else(|| BenchError::Config("chfsd is not running".into()))?;
    let block: Vec<u8> = (0..(4usize << 20)).map(|i| (i * 13) as u8).collect();
    let file_bytes = 256u64 << 20;
    let files = (a.gib << 30) / file_bytes;
    // Warm-up file, then the baseline.
    let mut f = b.create("warm")?;
    for k in 0..16u64 {
        f.pwrite_all(&block, k * block.len() as u64)?;
    }
    f.close()?;
    b.unlink("warm")?;
    let base = rss_kib(pid);
    let mut peak = base;
    let t0 = Instant::now();
    let mut buf = vec![0u8; block.len()];
    for i in 0..files {
        let p = format!("stream{i}");
        let mut f = b.create(&p)?;
        let mut off = 0;
        while off < file_bytes {
            f.pwrite_all(&block, off)?;
            off += block.len() as u64;
            peak = peak.max(rss_kib(pid));
        }
        f.fsync()?;
        f.close()?;
        let mut f = b.open_read(&p)?;
        let mut got = 0;
        while got < file_bytes {
            let n = f.pread(&mut buf, got)?;
            if n == 0 {
                return Err(BenchError::ShortRead {
                    path: p,
                    off: got,
                    got: 0,
                    want: block.len(),
                });
            }
            if buf[..n] != block[..n] {
                return Err(BenchError::Check(format!(
                    "{p}: data read at offset {got} differs from what was written"
                )));
            }
            got += n as u64;
            peak = peak.max(rss_kib(pid));
        }
        f.close()?;
        b.unlink(&p)?;
        if i % 8 == 7 {
            println!(
                "  {:>5} MiB through, RSS {} KiB (peak {peak} KiB)",
                (i + 1) * (file_bytes >> 20),
                rss_kib(pid)
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let total = files * file_bytes;
    println!(
        "posix engine in {}: {} MiB written, read back and removed in {secs:.1} s ({:.0} MiB/s of file data moved); chfsd RSS base {base} KiB, peak {peak} KiB, growth {} KiB",
        dir.display(),
        total >> 20,
        (2 * (total >> 20)) as f64 / secs,
        peak - base
    );
    Ok(())
}
