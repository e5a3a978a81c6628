//! Sequential bandwidth of one process through the Rust client: writes a
//! file of SIZE_MIB MiB in requests of REQ_KIB KiB, then reads it back the
//! same way, and prints `{"write_mib_s": W, "read_mib_s": R}`. The pool is
//! `CHFS_SERVER` (and `CHFS_SECRET_FILE`). python/bench.py runs it beside
//! the same workload from Python.
//!
//! Usage: seqbw PATH [SIZE_MIB] [REQ_KIB]

use std::time::Instant;

use chfs_client::{flags, Client};

fn main() {
    if let Err(e) = run() {
        eprintln!("seqbw: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: seqbw PATH [SIZE_MIB] [REQ_KIB]")?;
    let size_mib: u64 = args.get(1).map_or(Ok(1024), |s| s.parse())?;
    let req = args.get(2).map_or(Ok(1024), |s| s.parse::<usize>())? << 10;
    let total = size_mib << 20;
    let c = Client::from_env()?;
    let mut buf = vec![0u8; req];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i * 7 + 1) as u8;
    }
    let t = Instant::now();
    let fd = c.open(
        path,
        flags::O_WRONLY | flags::O_CREAT | flags::O_TRUNC,
        0o644,
    )?;
    let mut off = 0u64;
    while off < total {
        let n = c.pwrite(fd, &buf, off)?;
        off += n as u64;
    }
    c.close(fd)?;
    let w = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let fd = c.open(path, flags::O_RDONLY, 0)?;
    let mut off = 0u64;
    loop {
        let n = c.pread(fd, &mut buf, off)?;
        if n == 0 {
            break;
        }
        off += n as u64;
    }
    c.close(fd)?;
    let r = t.elapsed().as_secs_f64();
    if off != total {
        return Err(format!("read {off} bytes of {total}").into());
    }
    let mib = size_mib as f64;
    println!(
        "{{\"write_mib_s\": {:.1}, \"read_mib_s\": {:.1}}}",
        mib / w,
        mib / r
    );
    Ok(())
}
