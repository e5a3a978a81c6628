//! IOR-hard's read as one rank of NRANKS does it (every NRANKS-th record
//! of 47,008 bytes, from the second), through the Rust client with the
//! strided read-ahead off and on (`Client::set_read_ahead`), and the same
//! on a file in REF_DIR (`pread`, e.g. /dev/shm), in turn, REPS times.
//! Prints per record: wall time, this process's CPU time and the servers'
//! (status `cpu_ns`), which a loaded machine disturbs less than the wall
//! time. The pool is `CHFS_SERVER` (and `CHFS_SECRET_FILE`); the
//! read-ahead sizes tried are `HARDREAD_AHEAD` (default `0,1048576`).
//!
//! Usage: hardread PATH REF_DIR [NRANKS] [RECORDS] [REPS]

use std::os::unix::fs::FileExt;
use std::time::Instant;

use chfs_client::{flags, Client};

const REC: usize = 47008;

fn main() {
    if let Err(e) = run() {
        eprintln!("hardread: {e}");
        std::process::exit(1);
    }
}

/// User + system CPU time of this process, in seconds.
fn cpu() -> f64 {
    // SAFETY: getrusage writes the struct it is given, nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `u` is a valid rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn server_cpu(c: &Client) -> f64 {
    c.server_status()
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .map(|s| s.cpu_ns as f64 * 1e-9)
        .sum()
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: hardread PATH REF_DIR [NRANKS] [RECORDS] [REPS]";
    let path = args.first().ok_or(usage)?;
    let ref_dir = args.get(1).ok_or(usage)?;
    let nranks: u64 = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let records: u64 = args.get(3).map_or(Ok(10000), |s| s.parse())?;
    let reps: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
    let c = Client::from_env()?;
    let mut buf = vec![0u8; REC];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let ref_path = format!("{ref_dir}/hardread.{}", std::process::id());
    let reff = std::fs::File::create(&ref_path)?;
    let fd = c.open(
        path,
        flags::O_WRONLY | flags::O_CREAT | flags::O_TRUNC,
        0o644,
    )?;
    for i in 0..nranks * records {
        c.pwrite(fd, &buf, i * REC as u64)?;
        reff.write_all_at(&buf, i * REC as u64)?;
    }
    c.close(fd)?;
    let offs: Vec<u64> = (0..records)
        .map(|i| (i * nranks + 1) * REC as u64)
        .collect();
    for rep in 0..reps {
        let sizes: Vec<usize> = std::env::var("HARDREAD_AHEAD")
            .unwrap_or_else(|_| "0,1048576".into())
            .split(',')
            .map(|v| v.parse())
            .collect::<Result<_, _>>()?;
        for ra in sizes {
            c.set_read_ahead(ra);
            let (t, u, s) = (Instant::now(), cpu(), server_cpu(&c));
            let fd = c.open(path, flags::O_RDONLY, 0)?;
            for &o in &offs {
                if c.pread(fd, &mut buf, o)? != REC {
                    return Err("short read".into());
                }
            }
            c.close(fd)?;
            let (w, u) = (t.elapsed().as_secs_f64(), cpu() - u);
            let s = server_cpu(&c) - s;
            let n = records as f64;
            println!(
                "rep {rep} read-ahead {ra:>7}: {:6.1} us/record wall, client cpu {:5.1} us, server cpu {:5.1} us",
                w / n * 1e6,
                u / n * 1e6,
                s / n * 1e6
            );
        }
        let (t, u) = (Instant::now(), cpu());
        let f = std::fs::File::open(&ref_path)?;
        for &o in &offs {
            f.read_exact_at(&mut buf, o)?;
        }
        let (w, u) = (t.elapsed().as_secs_f64(), cpu() - u);
        let n = records as f64;
        println!(
            "rep {rep} {ref_dir:>18}: {:6.1} us/record wall, cpu {:5.1} us",
            w / n * 1e6,
            u / n * 1e6
        );
    }
    std::fs::remove_file(&ref_path)?;
    c.unlink(path)?;
    Ok(())
}
