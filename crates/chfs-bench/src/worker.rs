//! What one rank does in each phase, the messages between the leader and
//! its worker processes, and the worker's main loop.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::fs::{Backend, ChfsBackend, PosixBackend};
use crate::pattern::{self, Phase, IOR_HARD_FILE, IOR_HARD_XFER, MD_HARD_SIZE};

/// What a rank presents to a pool to be let in.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum PoolCredential {
    /// `CHFS_SECRET_FILE` / `CHFS_SECRET` of the environment (a pool the
    /// benchmark did not start).
    #[default]
    Env,
    /// This secret or client key file (a local pool's client key).
    File(PathBuf),
    /// None (a local pool started with `--no-secret`).
    None,
}

impl PoolCredential {
    fn is_env(&self) -> bool {
        *self == PoolCredential::Env
    }

    /// How a local pool's clients get in: its client key, or nothing for a
    /// pool without a secret.
    pub fn of(pool: &chfs_localpool::LocalPool) -> PoolCredential {
        pool.client_key_file()
            .map_or(PoolCredential::None, PoolCredential::File)
    }
}

/// Where a target lives.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum TargetSpec {
    /// A chfs-rs pool (`CHFS_SERVER` syntax).
    Chfs {
        /// Server addresses, comma separated.
        servers: String,
        /// How its ranks are let in.
        #[serde(default, skip_serializing_if = "PoolCredential::is_env")]
        credential: PoolCredential,
    },
    /// A directory, through POSIX calls.
    Posix {
        /// The directory.
        dir: PathBuf,
    },
}

impl TargetSpec {
    /// Connects to the target; `name` is the benchmark's directory in it.
    pub fn backend(&self, name: &str) -> Result<Box<dyn Backend>> {
        match self {
            TargetSpec::Chfs {
                servers,
                credential,
            } => {
                let cfg = chfs_config(servers, credential)?;
                let c =
                    Client::connect(cfg).map_err(|e| BenchError::chfs("connect", servers, e))?;
                Ok(Box::new(ChfsBackend::new(c, &format!("/{name}"))))
            }
            TargetSpec::Posix { dir } => Ok(Box::new(PosixBackend::new(dir.join(name)))),
        }
    }

    /// Short description.
    pub fn describe(&self) -> String {
        match self {
            TargetSpec::Chfs { servers, .. } => format!("chfs-rs pool {servers}"),
            TargetSpec::Posix { dir } => format!("POSIX {}", dir.display()),
        }
    }
}

/// The client configuration from the environment, with `servers` as the
/// contact list and `credential` as the secret or key.
pub fn chfs_config(servers: &str, credential: &PoolCredential) -> Result<ClientConfig> {
    ClientConfig::from_lookup(|k| match (k, credential) {
        ("CHFS_SERVER", _) => Some(servers.to_string()),
        ("CHFS_SECRET_FILE", PoolCredential::File(f)) => Some(f.display().to_string()),
        ("CHFS_SECRET_FILE" | "CHFS_SECRET", PoolCredential::File(_) | PoolCredential::None) => {
            None
        }
        _ => std::env::var(k).ok(),
    })
    .map_err(|e| BenchError::chfs("config", servers, e))
}

/// Sizes and limits of a run (the same for every rank).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Params {
    /// Number of ranks.
    pub nprocs: usize,
    /// Stonewall: a write/create phase stops issuing new operations after
    /// this many seconds.
    pub stonewall_secs: f64,
    /// ior-easy transfer size in bytes.
    pub easy_xfer: usize,
    /// ior-easy: most transfers per rank.
    pub easy_max_segments: u64,
    /// ior-hard: most 47,008-byte records per rank.
    pub hard_max_records: u64,
    /// mdtest-easy: most files per rank.
    pub md_easy_max: u64,
    /// mdtest-hard: most files per rank.
    pub md_hard_max: u64,
    /// Rank `r` reads, stats and deletes what rank `r + shift` wrote.
    #[serde(default = "one")]
    pub shift: usize,
    /// `--prefault`: the memory the run uses was touched before the first
    /// phase.
    #[serde(default)]
    pub prefault: bool,
    /// `--bind-to core`: each local rank runs on one CPU of those the
    /// leader may use (rank r on the (r mod n)-th), as `mpirun` binds
    /// ranks by default; a pinned client thread then uses CPU lanes.
    #[serde(default)]
    pub bind: bool,
}

fn one() -> usize {
    1
}

/// The CPU a local worker pins itself to ([`Params::bind`]), set by the
/// leader in the worker's environment.
pub const PIN_VAR: &str = "CHFS_BENCH_PIN_CPU";

/// What the leader asks of a rank.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Work {
    /// An IO500 phase (not find, which the leader runs).
    Io500(Phase),
    /// Every rank opens the one shared file at once.
    OpenStorm,
    /// `--prefault`: touch the buffers the phases use, then write this
    /// many bytes to a file of this rank and delete it.
    Prefault(u64),
}

/// Leader to worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// Connect to a target.
    Init {
        /// Target id (several targets can share one set of ranks).
        id: usize,
        /// This worker's rank.
        rank: usize,
        /// The target.
        target: TargetSpec,
        /// Benchmark directory name inside the target.
        name: String,
        /// Parameters.
        params: Params,
    },
    /// Run one phase; `counts[r]` = items rank `r` wrote in the source phase.
    Run {
        /// Target id.
        id: usize,
        /// The work.
        work: Work,
        /// Items written per rank by the phase this one consumes.
        counts: Vec<u64>,
    },
    /// Drop the connection to a target (answered with `Ready`).
    Close {
        /// Target id.
        id: usize,
    },
    /// Exit.
    Quit,
}

/// Worker to leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    /// Connected.
    Ready,
    /// Items done so far in the current phase.
    Progress(u64),
    /// Phase finished.
    Done(RankResult),
    /// Something failed.
    Failed(String),
}

/// One rank's share of a phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RankResult {
    /// Operations (transfers or files) done.
    pub items: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds this rank spent.
    pub secs: f64,
    /// The stonewall stopped this rank before its maximum.
    pub stonewalled: bool,
    /// Items and bytes completed in each second of the phase (second `i`
    /// counted from this rank's start; seconds without a completion are
    /// zeros).
    #[serde(default)]
    pub series: Vec<[u64; 2]>,
}

fn check_stamp(buf: &[u8], path: &str, off: u64, want: (u64, u64)) -> Result<()> {
    let got = pattern::read_stamp(buf);
    if got != want {
        return Err(BenchError::Verify {
            path: path.to_string(),
            off,
            want,
            got,
        });
    }
    Ok(())
}

/// Reports progress at most every 100 ms, and keeps the totals at the end
/// of each second of the phase.
struct Ticker<'a> {
    f: &'a mut dyn FnMut(u64),
    start: Instant,
    last: Instant,
    /// `totals[i]`: items and bytes done by the end of second `i`.
    totals: Vec<[u64; 2]>,
}

impl Ticker<'_> {
    /// After each item: `r` holds the totals so far.
    fn tick(&mut self, r: &RankResult) {
        let now = Instant::now();
        self.record(now, [r.items, r.bytes]);
        if now - self.last >= Duration::from_millis(100) {
            (self.f)(r.items);
            self.last = now;
        }
    }

    fn record(&mut self, now: Instant, total: [u64; 2]) {
        let sec = (now - self.start).as_secs() as usize;
        let prev = self.totals.last().copied().unwrap_or([0, 0]);
        if self.totals.len() <= sec {
            self.totals.resize(sec + 1, prev);
        }
        self.totals[sec] = total;
    }

    /// What was done in each second.
    fn series(&self) -> Vec<[u64; 2]> {
        let mut prev = [0, 0];
        self.totals
            .iter()
            .map(|t| {
                let d = [t[0] - prev[0], t[1] - prev[1]];
                prev = *t;
                d
            })
            .collect()
    }
}

thread_local! {
    /// Buffers of finished phases, to be used again: memory this rank has
    /// already touched (with `--prefault`, before the first phase).
    static SPARE: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes, filled with [`pattern::filler`]'s bytes or
/// zeros; a spare one if there is one large enough.
fn buffer(len: usize, fill: bool) -> Vec<u8> {
    let mut b = SPARE
        .with(|s| {
            let mut s = s.borrow_mut();
            let i = s.iter().position(|b| b.capacity() >= len)?;
            Some(s.swap_remove(i))
        })
        .unwrap_or_default();
    b.clear();
    if fill {
        pattern::fill(&mut b, len);
    } else {
        b.resize(len, 0);
    }
    b
}

/// Keeps `b` for a later phase.
fn spare(b: Vec<u8>) {
    SPARE.with(|s| s.borrow_mut().push(b));
}

/// The file a rank writes and deletes to prefault a target.
pub fn prefault_file(rank: usize) -> String {
    format!("prefault.{rank}")
}

/// Runs rank `rank`'s part of `work`. `counts` are the items each rank
/// wrote in the source phase (for reads, stats and deletes).
pub fn run_work(
    fs: &dyn Backend,
    rank: usize,
    p: &Params,
    work: Work,
    counts: &[u64],
    progress: &mut dyn FnMut(u64),
) -> Result<RankResult> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(p.stonewall_secs.max(0.0));
    let src = pattern::source_rank(rank, p.nprocs, p.shift);
    let src_count = counts.get(src).copied().unwrap_or(0);
    let mut t = Ticker {
        f: progress,
        start,
        last: start,
        totals: Vec::new(),
    };
    let mut r = RankResult::default();
    // Loop of a write phase: up to `max` items, stopped by the stonewall.
    macro_rules! bounded {
        ($max:expr, |$i:ident| $body:block) => {
            for $i in 0..$max {
                if Instant::now() >= deadline {
                    r.stonewalled = true;
                    break;
                }
                $body
                r.items += 1;
                t.tick(&r);
            }
        };
    }
    let phase = match work {
        Work::OpenStorm => {
            let f = fs.open_read(IOR_HARD_FILE)?;
            r.secs = start.elapsed().as_secs_f64();
            f.close()?;
            r.items = 1;
            return Ok(r);
        }
        Work::Prefault(bytes) => {
            // every buffer a phase takes, at once: touched, then spare
            let bufs: Vec<Vec<u8>> = [p.easy_xfer, IOR_HARD_XFER, MD_HARD_SIZE]
                .into_iter()
                .map(|len| buffer(len, true))
                .collect();
            let path = prefault_file(rank);
            let mut f = fs.create(&path)?;
            let chunk = &bufs[0];
            while r.bytes < bytes {
                let n = (bytes - r.bytes).min(chunk.len() as u64) as usize;
                f.pwrite_all(&chunk[..n], r.bytes)?;
                r.bytes += n as u64;
                r.items += 1;
                t.tick(&r);
            }
            f.close()?;
            fs.unlink(&path)?;
            bufs.into_iter().for_each(spare);
            r.secs = start.elapsed().as_secs_f64();
            return Ok(r);
        }
        Work::Io500(ph) => ph,
    };
    match phase {
        Phase::IorEasyWrite => {
            let path = pattern::ior_easy_file(rank);
            let mut buf = buffer(p.easy_xfer, true);
            let mut f = fs.create(&path)?;
            bounded!(p.easy_max_segments, |s| {
                pattern::stamp(&mut buf, rank as u64, s);
                f.pwrite_all(&buf, pattern::ior_easy_offset(s, p.easy_xfer))?;
                r.bytes += buf.len() as u64;
            });
            f.close()?;
            spare(buf);
        }
        Phase::IorEasyRead => {
            let path = pattern::ior_easy_file(src);
            let mut buf = buffer(p.easy_xfer, false);
            let mut f = fs.open_read(&path)?;
            for s in 0..src_count {
                let off = pattern::ior_easy_offset(s, p.easy_xfer);
                f.pread_exact(&mut buf, off)?;
                check_stamp(&buf, &path, off, (src as u64, s))?;
                r.bytes += buf.len() as u64;
                r.items += 1;
                t.tick(&r);
            }
            f.close()?;
            spare(buf);
        }
        Phase::IorHardWrite => {
            let mut buf = buffer(IOR_HARD_XFER, true);
            let mut f = fs.create(IOR_HARD_FILE)?;
            bounded!(p.hard_max_records, |s| {
                pattern::stamp(&mut buf, rank as u64, s);
                let off = pattern::ior_hard_offset(rank, s, p.nprocs, IOR_HARD_XFER);
                f.pwrite_all(&buf, off)?;
                r.bytes += buf.len() as u64;
            });
            f.close()?;
            spare(buf);
        }
        Phase::IorHardRead => {
            let mut buf = buffer(IOR_HARD_XFER, false);
            let mut f = fs.open_read(IOR_HARD_FILE)?;
            for s in 0..src_count {
                let off = pattern::ior_hard_offset(src, s, p.nprocs, IOR_HARD_XFER);
                f.pread_exact(&mut buf, off)?;
                check_stamp(&buf, IOR_HARD_FILE, off, (src as u64, s))?;
                r.bytes += buf.len() as u64;
                r.items += 1;
                t.tick(&r);
            }
            f.close()?;
            spare(buf);
        }
        Phase::MdtestEasyWrite => {
            bounded!(p.md_easy_max, |i| {
                fs.create(&pattern::md_easy_file(rank, i))?.close()?;
            });
        }
        Phase::MdtestHardWrite => {
            let mut buf = buffer(MD_HARD_SIZE, true);
            bounded!(p.md_hard_max, |i| {
                pattern::stamp(&mut buf, rank as u64, i);
                let mut f = fs.create(&pattern::md_hard_file(rank, i))?;
                f.pwrite_all(&buf, 0)?;
                f.close()?;
                r.bytes += buf.len() as u64;
            });
            spare(buf);
        }
        Phase::MdtestEasyStat | Phase::MdtestHardStat => {
            let (want, name): (u64, fn(usize, u64) -> String) = if phase == Phase::MdtestEasyStat {
                (0, pattern::md_easy_file)
            } else {
                (MD_HARD_SIZE as u64, pattern::md_hard_file)
            };
            for i in 0..src_count {
                let path = name(src, i);
                let got = fs.size(&path)?;
                if got != want {
                    return Err(BenchError::Size { path, got, want });
                }
                r.items += 1;
                t.tick(&r);
            }
        }
        Phase::MdtestHardRead => {
            let mut buf = buffer(MD_HARD_SIZE, false);
            for i in 0..src_count {
                let path = pattern::md_hard_file(src, i);
                let mut f = fs.open_read(&path)?;
                f.pread_exact(&mut buf, 0)?;
                f.close()?;
                check_stamp(&buf, &path, 0, (src as u64, i))?;
                r.bytes += buf.len() as u64;
                r.items += 1;
                t.tick(&r);
            }
            spare(buf);
        }
        Phase::MdtestEasyDelete | Phase::MdtestHardDelete => {
            let name: fn(usize, u64) -> String = if phase == Phase::MdtestEasyDelete {
                pattern::md_easy_file
            } else {
                pattern::md_hard_file
            };
            for i in 0..src_count {
                fs.unlink(&name(src, i))?;
                r.items += 1;
                t.tick(&r);
            }
        }
        Phase::Find => {
            return Err(BenchError::Config(
                "find is run by the leader, not by a worker".into(),
            ))
        }
    }
    r.secs = start.elapsed().as_secs_f64();
    r.series = t.series();
    Ok(r)
}

fn send(out: &mut impl Write, m: &FromWorker) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// One rank's connections to the targets of a run, by target id.
#[derive(Default)]
pub struct WorkerState {
    targets: std::collections::HashMap<usize, (usize, Params, Box<dyn Backend>)>,
}

impl WorkerState {
    /// Handles one message; `None` for [`ToWorker::Quit`].
    pub fn handle(&mut self, msg: ToWorker, progress: &mut dyn FnMut(u64)) -> Option<FromWorker> {
        Some(match msg {
            ToWorker::Quit => return None,
            ToWorker::Init {
                id,
                rank,
                target,
                name,
                params,
            } => match target.backend(&name) {
                Ok(b) => {
                    self.targets.insert(id, (rank, params, b));
                    FromWorker::Ready
                }
                Err(e) => FromWorker::Failed(e.to_string()),
            },
            ToWorker::Run { id, work, counts } => match self.targets.get(&id) {
                None => FromWorker::Failed(format!("Run before Init of target {id}")),
                Some((rank, params, fs)) => {
                    match run_work(fs.as_ref(), *rank, params, work, &counts, progress) {
                        Ok(r) => FromWorker::Done(r),
                        Err(e) => FromWorker::Failed(e.to_string()),
                    }
                }
            },
            ToWorker::Close { id } => {
                self.targets.remove(&id);
                FromWorker::Ready
            }
        })
    }
}

/// The main loop of a worker process: JSON lines on stdin and stdout.
/// Returns when told to quit or when stdin closes.
pub fn worker_main() -> Result<()> {
    // Pinned before anything starts a thread (threads inherit it).
    if let Ok(cpu) = std::env::var(PIN_VAR) {
        let cpu: usize = cpu
            .parse()
            .map_err(|_| BenchError::Config(format!("{PIN_VAR}={cpu}: not a CPU number")))?;
        chfs_sys::cpu::pin_current_thread(cpu).map_err(|e| BenchError::io("pin to CPU", cpu, e))?;
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut state = WorkerState::default();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| BenchError::io("read", "stdin", e))?;
        let msg: ToWorker = serde_json::from_str(&line)?;
        let mut prog = |n: u64| {
            let _ = send(&mut std::io::stdout(), &FromWorker::Progress(n));
        };
        let Some(reply) = state.handle(msg, &mut prog) else {
            return Ok(());
        };
        send(&mut out, &reply).map_err(|e| BenchError::io("write", "stdout", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::PosixBackend;

    fn params(nprocs: usize) -> Params {
        Params {
            nprocs,
            stonewall_secs: 60.0,
            easy_xfer: 1000,
            easy_max_segments: 5,
            hard_max_records: 4,
            md_easy_max: 7,
            md_hard_max: 6,
            shift: 1,
            prefault: false,
            bind: false,
        }
    }

    /// The totals at the end of each second become what was done in each
    /// second; a second without a completion is a zero.
    #[test]
    fn ticker_keeps_what_was_done_in_each_second() {
        let mut f = |_| {};
        let start = Instant::now();
        let mut t = Ticker {
            f: &mut f,
            start,
            last: start,
            totals: Vec::new(),
        };
        t.record(start + Duration::from_millis(100), [1, 10]);
        t.record(start + Duration::from_millis(900), [3, 30]);
        t.record(start + Duration::from_millis(2200), [5, 50]);
        t.record(start + Duration::from_millis(2300), [6, 60]);
        assert_eq!(t.series(), vec![[3, 30], [0, 0], [3, 30]]);
        // run_work reports it: every item of a phase is in its series
        let d = tempfile::tempdir().unwrap();
        let fs = PosixBackend::new(d.path());
        for dir in pattern::directories(1) {
            fs.mkdir(&dir).unwrap();
        }
        let r = run_work(
            &fs,
            0,
            &params(1),
            Work::Io500(Phase::MdtestHardWrite),
            &[],
            &mut |_| {},
        )
        .unwrap();
        let items: u64 = r.series.iter().map(|x| x[0]).sum();
        let bytes: u64 = r.series.iter().map(|x| x[1]).sum();
        assert_eq!((items, bytes), (6, 6 * MD_HARD_SIZE as u64));
    }

    /// Prefault writes exactly what it was asked to, in a file it deletes,
    /// and leaves its buffers to the phases.
    #[test]
    fn prefault_writes_and_deletes_and_leaves_buffers_touched() {
        let d = tempfile::tempdir().unwrap();
        let fs = PosixBackend::new(d.path());
        let p = params(2);
        let bytes = 3 * 1000 + 7;
        let r = run_work(&fs, 1, &p, Work::Prefault(bytes), &[], &mut |_| {}).unwrap();
        assert_eq!((r.bytes, r.items), (bytes, 4));
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let large =
            |len: usize| SPARE.with(|s| s.borrow().iter().filter(|b| b.capacity() >= len).count());
        assert_eq!(SPARE.with(|s| s.borrow().len()), 3);
        assert!(large(IOR_HARD_XFER) >= 1);
        // a phase takes one of them, filled as the pattern wants
        let b = buffer(MD_HARD_SIZE, true);
        assert_eq!(b, pattern::filler(MD_HARD_SIZE));
        assert_eq!(SPARE.with(|s| s.borrow().len()), 2);
        spare(b);
    }

    /// Runs every phase rank by rank (in one process) on a directory.
    #[test]
    fn all_phases_move_what_they_claim() {
        let t = tempfile::tempdir().unwrap();
        let fs = PosixBackend::new(t.path());
        let n = 3;
        let p = params(n);
        for d in pattern::directories(n) {
            fs.mkdir(&d).unwrap();
        }
        let mut written: std::collections::HashMap<Phase, Vec<u64>> = Default::default();
        for ph in Phase::ALL {
            if ph == Phase::Find {
                continue;
            }
            let counts = ph.source().map(|s| written[&s].clone()).unwrap_or_default();
            let rs: Vec<RankResult> = (0..n)
                .map(|r| run_work(&fs, r, &p, Work::Io500(ph), &counts, &mut |_| {}).unwrap())
                .collect();
            let items: Vec<u64> = rs.iter().map(|r| r.items).collect();
            let bytes: u64 = rs.iter().map(|r| r.bytes).sum();
            match ph {
                Phase::IorEasyWrite | Phase::IorEasyRead => {
                    assert_eq!(items, [5, 5, 5]);
                    assert_eq!(bytes, 15 * 1000);
                }
                Phase::IorHardWrite | Phase::IorHardRead => {
                    assert_eq!(items, [4, 4, 4]);
                    assert_eq!(bytes, 12 * IOR_HARD_XFER as u64);
                }
                Phase::MdtestEasyWrite | Phase::MdtestEasyStat | Phase::MdtestEasyDelete => {
                    assert_eq!(items, [7, 7, 7])
                }
                _ => assert_eq!(items, [6, 6, 6], "{ph:?}"),
            }
            if ph.is_write() {
                written.insert(ph, items);
            }
            if ph == Phase::IorHardWrite {
                // the shared file holds exactly the interleaved records
                assert_eq!(fs.size(IOR_HARD_FILE).unwrap(), 12 * IOR_HARD_XFER as u64);
            }
        }
        // deletes removed every mdtest file
        for d in ["mdtest-hard", "mdtest-easy/rank0", "mdtest-easy/rank2"] {
            assert_eq!(
                std::fs::read_dir(t.path().join(d)).unwrap().count(),
                0,
                "{d}"
            );
        }
    }

    #[test]
    fn stonewall_bounds_writes_and_reads_use_what_was_written() {
        let t = tempfile::tempdir().unwrap();
        let fs = PosixBackend::new(t.path());
        let mut p = params(2);
        p.stonewall_secs = 0.0;
        for d in pattern::directories(2) {
            fs.mkdir(&d).unwrap();
        }
        let r = run_work(
            &fs,
            0,
            &p,
            Work::Io500(Phase::MdtestHardWrite),
            &[],
            &mut |_| {},
        )
        .unwrap();
        assert!(r.stonewalled);
        assert_eq!(r.items, 0);
        // reading rank 1's files (source of rank 0) with a count of 0 reads none
        let r = run_work(
            &fs,
            0,
            &p,
            Work::Io500(Phase::MdtestHardRead),
            &[0, 0],
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(r.items, 0);
    }

    #[test]
    fn wrong_data_and_missing_files_are_errors() {
        let t = tempfile::tempdir().unwrap();
        let fs = PosixBackend::new(t.path());
        let p = params(2);
        for d in pattern::directories(2) {
            fs.mkdir(&d).unwrap();
        }
        for r in 0..2 {
            run_work(
                &fs,
                r,
                &p,
                Work::Io500(Phase::IorHardWrite),
                &[],
                &mut |_| {},
            )
            .unwrap();
        }
        // rank 0 reads rank 1's records; corrupt record 2 of rank 1
        let off = pattern::ior_hard_offset(1, 2, 2, IOR_HARD_XFER);
        let mut f = fs.create(IOR_HARD_FILE).unwrap();
        let mut bad = vec![0u8; 16];
        pattern::stamp(&mut bad, 0, 2);
        f.pwrite_all(&bad, off).unwrap();
        f.close().unwrap();
        let e = run_work(
            &fs,
            0,
            &p,
            Work::Io500(Phase::IorHardRead),
            &[4, 4],
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                BenchError::Verify {
                    want: (1, 2),
                    got: (0, 2),
                    ..
                }
            ),
            "{e}"
        );
        // rank 1 reads rank 0's records: intact
        run_work(
            &fs,
            1,
            &p,
            Work::Io500(Phase::IorHardRead),
            &[4, 4],
            &mut |_| {},
        )
        .unwrap();
        // claiming more than was written: a short read, not a silent success
        let e = run_work(
            &fs,
            1,
            &p,
            Work::Io500(Phase::IorHardRead),
            &[9, 9],
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, BenchError::ShortRead { .. }), "{e}");
        let e = run_work(
            &fs,
            0,
            &p,
            Work::Io500(Phase::MdtestHardStat),
            &[1, 1],
            &mut |_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("mdtest-hard/file.mdtest.1.0"), "{e}");
        let e = run_work(&fs, 0, &p, Work::Io500(Phase::Find), &[], &mut |_| {}).unwrap_err();
        assert!(matches!(e, BenchError::Config(_)));
    }
}
