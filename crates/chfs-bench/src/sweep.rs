//! Single-process bandwidth sweep (seed 003): write and read bandwidth
//! against request size for several chunk sizes, with the chunk RPCs of one
//! call pipelined and issued one after another, measured side by side.

use std::time::Instant;

use chfs_client::{flags, Client};
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::score::mib_s;
use crate::worker::{chfs_config, PoolCredential};

/// One point of the sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SweepPoint {
    /// Chunk size of the file.
    pub chunk_size: u32,
    /// Bytes per write/read call.
    pub request_size: usize,
    /// Bytes written and read.
    pub file_bytes: u64,
    /// Write MiB/s with pipelined chunk RPCs.
    pub pipelined_write_mib_s: f64,
    /// Read MiB/s with pipelined chunk RPCs.
    pub pipelined_read_mib_s: f64,
    /// Write MiB/s with one chunk RPC at a time.
    pub sequential_write_mib_s: f64,
    /// Read MiB/s with one chunk RPC at a time.
    pub sequential_read_mib_s: f64,
}

/// Writes then reads `file_bytes` in `req`-byte calls; returns (write, read) MiB/s.
fn one(c: &Client, path: &str, cs: u32, req: usize, file_bytes: u64) -> Result<(f64, f64)> {
    let n = file_bytes.div_ceil(req as u64).max(1);
    let mut buf = crate::pattern::filler(req);
    let fd = c
        .open_chunk_size(
            path,
            flags::O_CREAT | flags::O_TRUNC | flags::O_WRONLY,
            0o644,
            cs,
        )
        .map_err(|e| BenchError::chfs("create", path, e))?;
    let t = Instant::now();
    for i in 0..n {
        let mut done = 0;
        while done < req {
            done += c
                .pwrite(fd, &buf[done..], i * req as u64 + done as u64)
                .map_err(|e| BenchError::chfs("pwrite", path, e))?;
        }
    }
    c.close(fd)
        .map_err(|e| BenchError::chfs("close", path, e))?;
    let w = mib_s(n * req as u64, t.elapsed().as_secs_f64());
    let fd = c
        .open(path, flags::O_RDONLY, 0)
        .map_err(|e| BenchError::chfs("open", path, e))?;
    let t = Instant::now();
    let mut got = 0u64;
    for i in 0..n {
        let k = c
            .pread(fd, &mut buf, i * req as u64)
            .map_err(|e| BenchError::chfs("pread", path, e))?;
        got += k as u64;
    }
    let r = mib_s(got, t.elapsed().as_secs_f64());
    c.close(fd)
        .map_err(|e| BenchError::chfs("close", path, e))?;
    c.unlink(path)
        .map_err(|e| BenchError::chfs("unlink", path, e))?;
    if got != n * req as u64 {
        return Err(BenchError::ShortRead {
            path: path.into(),
            off: 0,
            got: got as usize,
            want: (n * req as u64) as usize,
        });
    }
    Ok((w, r))
}

/// Median of each column of (write, read) pairs.
pub fn medians(v: &[(f64, f64)]) -> (f64, f64) {
    let med = |mut x: Vec<f64>| {
        x.sort_by(f64::total_cmp);
        match x.len() {
            0 => 0.0,
            n if n % 2 == 1 => x[n / 2],
            n => (x[n / 2 - 1] + x[n / 2]) / 2.0,
        }
    };
    (
        med(v.iter().map(|p| p.0).collect()),
        med(v.iter().map(|p| p.1).collect()),
    )
}

/// Runs the sweep against the pool at `servers` (let in with
/// `credential`): every point `reps`
/// times, alternating which mode runs first, reporting medians.
pub fn sweep(
    servers: &str,
    credential: &PoolCredential,
    chunk_sizes: &[u32],
    request_sizes: &[usize],
    file_bytes: u64,
    reps: usize,
) -> Result<Vec<SweepPoint>> {
    let mut cfg = chfs_config(servers, credential)?;
    cfg.async_access = true;
    let piped =
        Client::connect(cfg.clone()).map_err(|e| BenchError::chfs("connect", servers, e))?;
    cfg.async_access = false;
    let seq = Client::connect(cfg).map_err(|e| BenchError::chfs("connect", servers, e))?;
    let base = format!("/chfs-sweep-{}", std::process::id());
    let mut out = Vec::new();
    for &cs in chunk_sizes {
        for &req in request_sizes {
            if req == 0 {
                return Err(BenchError::Config("request size 0".into()));
            }
            // Repeated, alternating which mode goes first; medians.
            let (mut p, mut q) = (Vec::new(), Vec::new());
            for rep in 0..reps.max(1) {
                let pp = format!("{base}-p-{cs}-{req}");
                let sp = format!("{base}-s-{cs}-{req}");
                if rep % 2 == 0 {
                    p.push(one(&piped, &pp, cs, req, file_bytes)?);
                    q.push(one(&seq, &sp, cs, req, file_bytes)?);
                } else {
                    q.push(one(&seq, &sp, cs, req, file_bytes)?);
                    p.push(one(&piped, &pp, cs, req, file_bytes)?);
                }
            }
            let (pw, pr) = medians(&p);
            let (sw, sr) = medians(&q);
            out.push(SweepPoint {
                chunk_size: cs,
                request_size: req,
                file_bytes,
                pipelined_write_mib_s: pw,
                pipelined_read_mib_s: pr,
                sequential_write_mib_s: sw,
                sequential_read_mib_s: sr,
            });
        }
    }
    Ok(out)
}

/// The sweep as a table.
pub fn table(points: &[SweepPoint]) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "{:>10} {:>10} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}\n",
        "chunk", "request", "pipe-wr", "pipe-rd", "seq-wr", "seq-rd", "wr x", "rd x"
    );
    for p in points {
        let _ = writeln!(
            s,
            "{:>10} {:>10} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>8.2} {:>8.2}",
            p.chunk_size,
            p.request_size,
            p.pipelined_write_mib_s,
            p.pipelined_read_mib_s,
            p.sequential_write_mib_s,
            p.sequential_read_mib_s,
            p.pipelined_write_mib_s / p.sequential_write_mib_s.max(1e-9),
            p.pipelined_read_mib_s / p.sequential_read_mib_s.max(1e-9),
        );
    }
    s.push_str("(MiB/s; 'x' = pipelined / sequential, measured in the same run)\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_by_hand() {
        assert_eq!(medians(&[(1.0, 9.0), (3.0, 7.0), (2.0, 8.0)]), (2.0, 8.0));
        assert_eq!(medians(&[(1.0, 4.0), (3.0, 2.0)]), (2.0, 3.0));
        assert_eq!(medians(&[]), (0.0, 0.0));
    }
}
