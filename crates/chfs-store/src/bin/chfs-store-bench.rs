//! chfs-store-bench — bandwidth and metadata rates of the storage engines
//! against the DRAM engine, measured in one run (engines alternate, the
//! median of the rounds is reported).
//!
//! ```text
//! chfs-store-bench [--mib N] [--chunk BYTES] [--threads T] [--entries N]
//!                  [--rounds R] [--shm DIR] [--disk DIR] [--pmem-disk]
//!                  [--only ENGINE-PREFIX] [--cold]
//! ```
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chfs_proto::Meta;
use chfs_store::{MemStore, PmemStore, PosixStore, Store};

struct Opts {
    mib: u64,
    chunk: u32,
    threads: usize,
    entries: usize,
    rounds: usize,
    shm: PathBuf,
    disk: PathBuf,
    pmem_disk: bool,
    cold: bool,
    only: Option<String>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        mib: 512,
        chunk: 1 << 20,
        threads: 2,
        entries: 50_000,
        rounds: 3,
        shm: PathBuf::from("/dev/shm"),
        disk: std::env::temp_dir(),
        pmem_disk: false,
        cold: false,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("bad number {v:?}"));
        match a.as_str() {
            "--mib" => o.mib = num(val()?)?,
            "--chunk" => o.chunk = num(val()?)? as u32,
            "--threads" => o.threads = num(val()?)?.max(1) as usize,
            "--entries" => o.entries = num(val()?)? as usize,
            "--rounds" => o.rounds = num(val()?)?.max(1) as usize,
            "--shm" => o.shm = PathBuf::from(val()?),
            "--disk" => o.disk = PathBuf::from(val()?),
            "--pmem-disk" => o.pmem_disk = true,
            "--cold" => o.cold = true,
            "--only" => o.only = Some(val()?),
            "-h" | "--help" => {
                return Err("usage: chfs-store-bench [--mib N] [--chunk BYTES] [--threads T] [--entries N] [--rounds R] [--shm DIR] [--disk DIR] [--pmem-disk] [--only ENGINE-PREFIX] [--cold]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if o.chunk == 0 || o.chunk > chfs_proto::MAX_CHUNK_SIZE {
        return Err("--chunk out of range".into());
    }
    Ok(o)
}

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
fn timed(threads: usize, f: impl Fn(usize) + Sync) -> f64 {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t));
        }
    });
    t0.elapsed().as_secs_f64()
}

fn run(s: &dyn Store, o: &Opts) -> Figures {
    let chunks_total = (o.mib << 20) / o.chunk as u64;
    let per = chunks_total / o.threads as u64;
    let data: Vec<u8> = (0..o.chunk).map(|i| (i * 131) as u8).collect();
    let m = meta(1, o.chunk);
    for t in 0..o.threads {
        s.create(&format!("/bw{t}"), m, b"", false).unwrap();
    }
    let secs = timed(o.threads, |t| {
        let p = format!("/bw{t}");
        for i in 0..per {
            s.write(&p, i + 1, 0, &data, &m).unwrap();
        }
    });
    let bytes = (per * o.threads as u64 * o.chunk as u64) as f64;
    let write_mibs = bytes / secs / (1 << 20) as f64;
    let secs = timed(o.threads, |t| {
        let p = format!("/bw{t}");
        for i in 0..per {
            let d = s.read(&p, i + 1, 1, 0, o.chunk).unwrap().unwrap();
            assert_eq!(d.len(), o.chunk as usize);
        }
    });
    let read_mibs = bytes / secs / (1 << 20) as f64;
    for t in 0..o.threads {
        s.remove_chunks(&format!("/bw{t}"), 0).unwrap();
    }
    let n = o.entries / o.threads;
    let ops = (n * o.threads) as f64;
    let em = meta(2, 65536);
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            s.create(&format!("/md/t{t}/e{i}"), em, b"", true).unwrap();
        }
    });
    let create_ops = ops / secs;
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            assert!(s.meta(&format!("/md/t{t}/e{i}"), 0).unwrap().is_some());
        }
    });
    let stat_ops = ops / secs;
    let secs = timed(o.threads, |t| {
        for i in 0..n {
            s.remove(&format!("/md/t{t}/e{i}"), 0, &mut |_| Ok(()))
                .unwrap();
        }
    });
    let remove_ops = ops / secs;
    Figures {
        write_mibs,
        read_mibs,
        create_ops,
        stat_ops,
        remove_ops,
    }
}

/// Opens an engine in a scratch directory.
type Opener = Box<dyn Fn(&Path) -> Arc<dyn Store>>;
/// A column of the report: heading and the figure it shows.
type Column = (&'static str, fn(&Figures) -> f64);

struct Engine {
    name: String,
    open: Opener,
    dir: Option<PathBuf>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let cap = (o.mib << 20) * 2 + (64 << 20) + o.entries as u64 * 1024;
    let mut engines = vec![Engine {
        name: "mem".into(),
        open: Box::new(|_| Arc::new(MemStore::new(0))),
        dir: None,
    }];
    let pm = |dir: &Path, label: &str| Engine {
        name: format!("pmem ({label})"),
        open: Box::new(move |d: &Path| {
            Arc::new(PmemStore::open(&d.join("bench.pmem"), cap).unwrap())
        }),
        dir: Some(dir.to_path_buf()),
    };
    let px = |dir: &Path, label: &str| Engine {
        name: format!("posix ({label})"),
        open: Box::new(|d: &Path| Arc::new(PosixStore::open(&d.join("posix"), 0).unwrap())),
        dir: Some(dir.to_path_buf()),
    };
    engines.push(pm(&o.shm, &o.shm.display().to_string()));
    if o.pmem_disk {
        engines.push(pm(&o.disk, &o.disk.display().to_string()));
    }
    engines.push(px(&o.shm, &o.shm.display().to_string()));
    engines.push(px(&o.disk, &o.disk.display().to_string()));
    if let Some(only) = &o.only {
        // The reference stays first.
        let keep: Vec<Engine> = engines
            .into_iter()
            .enumerate()
            .filter(|(i, e)| *i == 0 || e.name.starts_with(only.as_str()))
            .map(|(_, e)| e)
            .collect();
        engines = keep;
    }
    println!(
        "chfs-store-bench: {} MiB in {} B chunks, {} entries, {} threads, {} rounds (median), {}",
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
            let tmp = e.dir.as_ref().map(|d| {
                tempfile_dir(
                    d,
                    &format!("chfs-store-bench-{}-{round}-{i}", std::process::id()),
                )
            });
            let s = (e.open)(tmp.as_deref().unwrap_or(Path::new("/")));
            if !o.cold {
                run(&*s, &o);
            }
            let f = run(&*s, &o);
            drop(s);
            if let Some(t) = tmp {
                let _ = std::fs::remove_dir_all(t);
            }
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
}

fn tempfile_dir(parent: &Path, name: &str) -> PathBuf {
    let d = parent.join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}
