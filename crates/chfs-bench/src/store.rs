//! `chfs-bench store` (formerly the `chfs-store-bench` program of
//! chfs-store): bandwidth and metadata rates of the storage engines against
//! the DRAM engine, at the store level (the `chfs_store::Store` trait, no
//! server), measured in one run (engines alternate, the median of the
//! rounds is reported).
//!
//! Engines: `mem`; `pmem` on a file in `--shm` (tmpfs, default /dev/shm);
//! `posix` in `--shm` and in `--disk` (default the system temp directory);
//! with `--pmem-disk` also `pmem` on a file in `--disk` (msync at every
//! persistence point: slow by design). Workloads per engine: write N MiB in
//! chunk-sized values from T threads, read them back, then create, stat
//! and remove `--entries` empty entries (the metadata rate).
//!
//! Each round first runs the workload once unmeasured on the same store
//! (which ends empty), then measures a second pass: the steady state of a
//! server, whose memory has been touched before. On a fresh store every
//! first store to a 4 KiB page of the mapping takes a page fault (the DRAM
//! engine's heap, reused between rounds, mostly does not), which is a
//! one-time cost of the medium, not of the engine; `--cold` measures the
//! first pass instead, on a fresh store every round.
//!
//! The same engines through real servers are `chfs-bench store-servers`
//! ([`crate::store_servers`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chfs_proto::Meta;
use chfs_store::{MemStore, PmemStore, PosixStore, Store};
use clap::Args;

use crate::error::{BenchError, Result};
use crate::score::median;
use crate::scratch::ScratchDir;

/// Options of `chfs-bench store`.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// MiB written and read per engine and pass.
    #[arg(long, default_value_t = 512)]
    pub mib: u64,
    /// Value (chunk) size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub chunk: u32,
    /// Threads working on the store at once.
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub threads: usize,
    /// Empty entries created, stat'ed and removed.
    #[arg(long, default_value_t = 50_000)]
    pub entries: usize,
    /// Rounds (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    pub rounds: usize,
    /// Directory on tmpfs for the pmem and posix engines.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub shm: PathBuf,
    /// Directory on a disk for the posix engine (and pmem with
    /// --pmem-disk); default: the system temp directory.
    #[arg(long, value_name = "DIR")]
    pub disk: Option<PathBuf>,
    /// Also the pmem engine on a file in --disk.
    #[arg(long)]
    pub pmem_disk: bool,
    /// Only the engines whose name starts with this (mem is always run, as
    /// the reference).
    #[arg(long, value_name = "ENGINE-PREFIX")]
    pub only: Option<String>,
    /// Measure the first pass on a fresh store every round.
    #[arg(long)]
    pub cold: bool,
}

/// A count of 1 or more (threads, rounds).
pub(crate) fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a number of at least 1")),
    }
}

/// The rates of one engine in one round.
#[derive(Clone, Copy, Default)]
struct Figures {
    write_mibs: f64,
    read_mibs: f64,
    create_ops: f64,
    stat_ops: f64,
    remove_ops: f64,
}

fn meta(fid: u32, chunk: u32) -> Meta {
    Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: chunk,
        fileid: fid,
        ..Default::default()
    }
}

/// Runs `f(thread)` on T threads and returns the elapsed seconds.
fn timed(threads: usize, f: impl Fn(usize) -> Result<()> + Sync) -> Result<f64> {
    let t0 = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(BenchError::Config("store thread panicked".into())))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(secs)
}

/// Wraps an engine's error on `path`.
fn err<'a>(
    op: &'static str,
    path: &'a str,
) -> impl FnOnce(chfs_store::StoreError) -> BenchError + 'a {
    move |e| BenchError::store(op, path, e)
}

fn run_one(s: &dyn Store, o: &StoreArgs) -> Result<Figures> {
    let chunks_total = (o.mib << 20) / o.chunk as u64;
    let per = chunks_total / o.threads as u64;
    let data: Vec<u8> = (0..o.chunk).map(|i| (i * 131) as u8).collect();
    let m = meta(1, o.chunk);
    for t in 0..o.threads {
        let p = format!("/bw{t}");
        s.create(&p, m, b"", false).map_err(err("create", &p))?;
    }
    let secs = timed(o.threads, |t| {
        let p = format!("/bw{t}");
        for i in 0..per {
            s.write(&p, i + 1, 0, &data, &m).map_err(err("write", &p))?;
        }
        Ok(())
    })?;
    let bytes = (per * o.threads as u64 * o.chunk as u64) as f64;
    let write_mibs = bytes / secs / (1 << 20) as f64;
    let secs = timed(o.threads, |t| {
        let p = format!("/bw{t}");
        for i in 0..per {
            let d = s.read(&p, i + 1, 1, 0, o.chunk).map_err(err("read", &p))?;
            let got = d.as_ref().map_or(0, Vec::len);
            if got != o.chunk as usize {
                return Err(BenchError::ShortRead {
                    path: format!("{p} chunk {}", i + 1),
                    off: 0,
                    got,
                    want: o.chunk as usize,
                });
            }
        }
        Ok(())
    })?;
    let read_mibs = bytes / secs / (1 << 20) as f64;
    for t in 0..o.threads {
        let p = format!("/bw{t}");
        s.remove_chunks(&p, 0).map_err(err("remove", &p))?;
    }
    let n = o.entries / o.threads;
    let ops = (n * o.threads) as f64;
    let em = meta(2, 65536);
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            let p = format!("/md/t{t}/e{i}");
            s.create(&p, em, b"", true).map_err(err("create", &p))?;
        }
        Ok(())
    })?;
    let create_ops = ops / secs;
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            let p = format!("/md/t{t}/e{i}");
            if s.meta(&p, 0).map_err(err("stat", &p))?.is_none() {
                return Err(BenchError::Check(format!("{p}: not found after create")));
            }
        }
        Ok(())
    })?;
    let stat_ops = ops / secs;
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            let p = format!("/md/t{t}/e{i}");
            s.remove(&p, 0, &mut |_| Ok(()))
                .map_err(err("remove", &p))?;
        }
        Ok(())
    })?;
    let remove_ops = ops / secs;
    Ok(Figures {
        write_mibs,
        read_mibs,
        create_ops,
        stat_ops,
        remove_ops,
    })
}

/// Opens an engine in a scratch directory.
type Opener = Box<dyn Fn(&Path) -> Result<Arc<dyn Store>>>;
/// A column of the report: heading and the figure it shows.
type Column = (&'static str, fn(&Figures) -> f64);

struct Engine {
    name: String,
    open: Opener,
    dir: Option<PathBuf>,
}

/// `chfs-bench store`.
pub fn run(o: &StoreArgs) -> Result<()> {
    if o.chunk == 0 || o.chunk > chfs_proto::MAX_CHUNK_SIZE {
        return Err(BenchError::Config("--chunk out of range".into()));
    }
    let disk = o.disk.clone().unwrap_or_else(std::env::temp_dir);
    let cap = (o.mib << 20) * 2 + (64 << 20) + o.entries as u64 * 1024;
    let mut engines = vec![Engine {
        name: "mem".into(),
        open: Box::new(|_| Ok(Arc::new(MemStore::new(0)))),
        dir: None,
    }];
    let pm = |dir: &Path| Engine {
        name: format!("pmem ({})", dir.display()),
        open: Box::new(move |d: &Path| {
            let p = d.join("bench.pmem");
            let s = PmemStore::open(&p, cap)
                .map_err(|e| BenchError::store("open", &p.display().to_string(), e))?;
            Ok(Arc::new(s))
        }),
        dir: Some(dir.to_path_buf()),
    };
    let px = |dir: &Path| Engine {
        name: format!("posix ({})", dir.display()),
        open: Box::new(|d: &Path| {
            let p = d.join("posix");
            let s = PosixStore::open(&p, 0)
                .map_err(|e| BenchError::store("open", &p.display().to_string(), e))?;
            Ok(Arc::new(s))
        }),
        dir: Some(dir.to_path_buf()),
    };
    engines.push(pm(&o.shm));
    if o.pmem_disk {
        engines.push(pm(&disk));
    }
    engines.push(px(&o.shm));
    engines.push(px(&disk));
    if let Some(only) = &o.only {
        // The reference stays first.
        engines = engines
            .into_iter()
            .enumerate()
            .filter(|(i, e)| *i == 0 || e.name.starts_with(only.as_str()))
            .map(|(_, e)| e)
            .collect();
    }
    println!(
        "chfs-bench store: {} MiB in {} B chunks, {} entries, {} threads, {} rounds (median), {}",
        o.mib,
        o.chunk,
        o.entries,
        o.threads,
        o.rounds,
        if o.cold {
            "cold (first pass on a fresh store)"
        } else {
            "warm (second pass on the same store)"
        }
    );
    let mut results: Vec<Vec<Figures>> = engines.iter().map(|_| Vec::new()).collect();
    for round in 0..o.rounds {
        for (i, e) in engines.iter().enumerate() {
            let tmp = match &e.dir {
                Some(d) => Some(ScratchDir::new(
                    d,
                    &format!("chfs-bench-store-{}-{round}-{i}", std::process::id()),
                )?),
                None => None,
            };
            let s = (e.open)(tmp.as_ref().map_or(Path::new("/"), |t| t.path()))?;
            if !o.cold {
                run_one(&*s, o)?;
            }
            let f = run_one(&*s, o)?;
            // The store goes before its directory.
            drop(s);
            drop(tmp);
            results[i].push(f);
        }
    }
    let med = |i: usize, g: fn(&Figures) -> f64| median(results[i].iter().map(g).collect());
    let cols: [Column; 5] = [
        ("write MiB/s", |f| f.write_mibs),
        ("read MiB/s", |f| f.read_mibs),
        ("create/s", |f| f.create_ops),
        ("stat/s", |f| f.stat_ops),
        ("remove/s", |f| f.remove_ops),
    ];
    print!("{:<28}", "engine");
    for (c, _) in &cols {
        print!("{c:>22}");
    }
    println!();
    for (i, e) in engines.iter().enumerate() {
        print!("{:<28}", e.name);
        for (_, g) in &cols {
            let v = med(i, *g);
            let r = v / med(0, *g);
            print!("{:>22}", format!("{v:.0} ({:.0}%)", r * 100.0));
        }
        println!();
    }
    println!("(percentages: ratio to the mem engine measured in the same run)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: StoreArgs,
    }

    /// A tiny round on every engine kind: all figures, nothing left.
    #[test]
    fn every_engine_runs_the_workload() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_str().unwrap();
        let a = Cli::parse_from([
            "x",
            "--mib",
            "2",
            "--chunk",
            "65536",
            "--entries",
            "40",
            "--rounds",
            "1",
            "--shm",
            dir,
            "--disk",
            dir,
        ])
        .a;
        run(&a).unwrap();
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0);
        let mem = MemStore::new(0);
        let f = run_one(&mem, &a).unwrap();
        assert!(f.write_mibs > 0.0 && f.remove_ops > 0.0);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(Cli::try_parse_from(["x", "--threads", "0"]).is_err());
        let a = Cli::parse_from(["x", "--chunk", "0"]).a;
        assert!(matches!(run(&a), Err(BenchError::Config(_))));
    }
}
