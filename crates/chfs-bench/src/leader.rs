//! The leader: starts one worker process per rank, drives the phases in
//! IO500's order with a barrier around each, runs find, and collects the
//! results of one target.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::error::{BenchError, Result};
use crate::fs::Backend;
use crate::pattern::{self, FindSpec, Kind, Phase, IOR_HARD_FILE, IOR_HARD_XFER, MD_HARD_SIZE};
use crate::report::{FindCheck, OpenStorm, PhaseResult, Prefault, TargetResult};
use crate::score;
use crate::worker::{FromWorker, Params, RankResult, TargetSpec, ToWorker, Work};

/// The hidden argument that makes the binary a worker.
pub const WORKER_ARG: &str = "--worker";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Makes SIGINT, SIGTERM and SIGHUP stop the run cleanly: the current
/// phase is abandoned, the workers are stopped and the benchmark
/// directories removed before the program exits with an error. For the
/// `chfs-bench` binary only (it replaces the process's handlers).
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; `signal` is called before any worker thread
        // relies on the previous disposition.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// The ranks working on one target.
pub trait Ranks {
    /// Runs one piece of work on every rank at once; returns each rank's
    /// result (in rank order) and the wall time from the start to the last
    /// rank's end.
    fn run(
        &mut self,
        work: Work,
        counts: &[u64],
        bar: Option<&ProgressBar>,
    ) -> Result<(Vec<RankResult>, f64)>;
}

/// Starts the ranks of a target.
pub trait Launcher {
    /// Connects every rank to `target` (benchmark directory `name`); `id`
    /// tells this target from the others of the same run.
    fn launch<'s>(
        &'s self,
        id: usize,
        target: &TargetSpec,
        name: &str,
        params: &Params,
    ) -> Result<Box<dyn Ranks + 's>>;
}

/// Ranks as local worker processes, a new set per target: the running
/// executable started again with [`WORKER_ARG`] as its first argument, so
/// a program using this launcher must call [`crate::worker::worker_main`]
/// when it sees that argument (as the `chfs-bench` binary does).
pub struct LocalLauncher;

impl Launcher for LocalLauncher {
    fn launch<'s>(
        &'s self,
        id: usize,
        target: &TargetSpec,
        name: &str,
        params: &Params,
    ) -> Result<Box<dyn Ranks + 's>> {
        Ok(Box::new(Workers::spawn(id, target, name, params)?))
    }
}

/// Running worker processes of one target.
pub struct Workers {
    id: usize,
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    rx: Receiver<(usize, std::result::Result<FromWorker, String>)>,
}

impl Workers {
    /// Starts `params.nprocs` workers (this executable with
    /// [`WORKER_ARG`]) and waits until each is connected to the target.
    pub fn spawn(id: usize, target: &TargetSpec, name: &str, params: &Params) -> Result<Workers> {
        let exe = std::env::current_exe().map_err(|e| BenchError::io("current_exe", "", e))?;
        let (tx, rx) = channel();
        let mut w = Workers {
            id,
            children: Vec::new(),
            stdins: Vec::new(),
            rx,
        };
        let cpus = if params.bind {
            chfs_sys::cpu::allowed().map_err(|e| BenchError::io("sched_getaffinity", "", e))?
        } else {
            Vec::new()
        };
        for rank in 0..params.nprocs {
            let mut cmd = Command::new(&exe);
            if !cpus.is_empty() {
                cmd.env(crate::worker::PIN_VAR, cpus[rank % cpus.len()].to_string());
            }
            let mut child = cmd
                .arg(WORKER_ARG)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| BenchError::io("spawn", exe.display(), e))?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(BenchError::Worker {
                    rank,
                    msg: "no pipes".into(),
                });
            };
            w.children.push(child);
            w.stdins.push(stdin);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let m = match line {
                        Ok(l) => serde_json::from_str::<FromWorker>(&l).map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if tx.send((rank, m)).is_err() {
                        return;
                    }
                }
                let _ = tx.send((rank, Err("exited".into())));
            });
        }
        for rank in 0..params.nprocs {
            let m = ToWorker::Init {
                id,
                rank,
                target: target.clone(),
                name: name.to_string(),
                params: params.clone(),
            };
            w.send(rank, &m)?;
        }
        w.collect(None, |_, m| match m {
            FromWorker::Ready => Ok(Some(())),
            other => Err(format!("unexpected {other:?}")),
        })?;
        Ok(w)
    }

    fn send(&mut self, rank: usize, m: &ToWorker) -> Result<()> {
        let mut line = serde_json::to_vec(m)?;
        line.push(b'\n');
        self.stdins[rank]
            .write_all(&line)
            .and_then(|_| self.stdins[rank].flush())
            .map_err(|e| BenchError::Worker {
                rank,
                msg: format!("cannot send: {e}"),
            })
    }

    /// Waits for one final message from every worker; progress goes to `bar`.
    fn collect<T>(
        &mut self,
        bar: Option<&ProgressBar>,
        mut f: impl FnMut(usize, FromWorker) -> std::result::Result<Option<T>, String>,
    ) -> Result<Vec<T>> {
        let n = self.stdins.len();
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut progress = vec![0u64; n];
        let mut left = n;
        while left > 0 {
            if interrupted() {
                return Err(BenchError::Interrupted);
            }
            let (rank, m) = match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok(x) => x,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(BenchError::Config("worker channel closed".into()))
                }
            };
            let m = m.map_err(|msg| BenchError::Worker { rank, msg })?;
            match m {
                FromWorker::Progress(p) => {
                    progress[rank] = p;
                    if let Some(b) = bar {
                        b.set_position(progress.iter().sum());
                    }
                }
                FromWorker::Failed(msg) => return Err(BenchError::Worker { rank, msg }),
                m => match f(rank, m) {
                    Ok(Some(v)) if out[rank].is_none() => {
                        out[rank] = Some(v);
                        left -= 1;
                    }
                    Ok(_) => {}
                    Err(msg) => return Err(BenchError::Worker { rank, msg }),
                },
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Runs one piece of work on every rank at once; returns each rank's
    /// result and the wall time from the start to the last rank's end.
    pub fn run(
        &mut self,
        work: Work,
        counts: &[u64],
        bar: Option<&ProgressBar>,
    ) -> Result<(Vec<RankResult>, f64)> {
        let t0 = Instant::now();
        for rank in 0..self.stdins.len() {
            self.send(
                rank,
                &ToWorker::Run {
                    id: self.id,
                    work,
                    counts: counts.to_vec(),
                },
            )?;
        }
        let r = self.collect(bar, |_, m| match m {
            FromWorker::Done(r) => Ok(Some(r)),
            other => Err(format!("unexpected {other:?}")),
        })?;
        Ok((r, t0.elapsed().as_secs_f64()))
    }
}

impl Ranks for Workers {
    fn run(
        &mut self,
        work: Work,
        counts: &[u64],
        bar: Option<&ProgressBar>,
    ) -> Result<(Vec<RankResult>, f64)> {
        Workers::run(self, work, counts, bar)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for i in 0..self.stdins.len() {
            let _ = self.send(i, &ToWorker::Quit);
        }
        self.stdins.clear();
        let wait = if interrupted() { 0 } else { 10 };
        let deadline = Instant::now() + Duration::from_secs(wait);
        for c in &mut self.children {
            loop {
                match c.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        // Our own child, by its handle (its recorded PID).
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                }
            }
        }
    }
}

/// Options of a run that are not worker parameters.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Show progress bars (only on a terminal).
    pub progress: bool,
    /// Keep the benchmark directory afterwards.
    pub keep: bool,
}

impl RunOptions {
    /// Progress only if stderr is a terminal.
    pub fn auto() -> Self {
        RunOptions {
            progress: std::io::stderr().is_terminal(),
            keep: false,
        }
    }
}

fn bar(opts: &RunOptions, label: &str, phase: &str, len: u64) -> Option<ProgressBar> {
    if !opts.progress {
        return None;
    }
    let b = ProgressBar::new(len.max(1));
    let style =
        ProgressStyle::with_template("{prefix:>10} {msg:<20} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    b.set_style(style);
    b.set_prefix(label.to_string());
    b.set_message(phase.to_string());
    Some(b)
}

/// A unique benchmark directory name.
pub fn unique_name() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("chfs-bench-{}-{t}", std::process::id())
}

/// One target being measured: its own backend (for setup, find and
/// cleanup) and its worker processes.
struct TargetRun<'a> {
    label: String,
    target: TargetSpec,
    fs: Box<dyn Backend>,
    workers: Option<Box<dyn Ranks + 'a>>,
    params: &'a Params,
    opts: &'a RunOptions,
    start_ns: i64,
    written: HashMap<Phase, Vec<u64>>,
    phases: Vec<PhaseResult>,
    find: FindCheck,
    prefault: Option<Prefault>,
    cleaned: bool,
}

impl<'a> TargetRun<'a> {
    fn start(
        id: usize,
        label: &str,
        target: &TargetSpec,
        params: &'a Params,
        opts: &'a RunOptions,
        launcher: &'a dyn Launcher,
    ) -> Result<Self> {
        let name = unique_name();
        let fs = target.backend(&name)?;
        let mut t = TargetRun {
            label: label.to_string(),
            target: target.clone(),
            fs,
            workers: None,
            params,
            opts,
            start_ns: 0,
            written: HashMap::new(),
            phases: Vec::new(),
            find: FindCheck::default(),
            prefault: None,
            cleaned: true,
        };
        t.fs.mkdir("")?;
        t.cleaned = false;
        for d in pattern::directories(params.nprocs) {
            t.fs.mkdir(&d)?;
        }
        t.fs.create(IOR_HARD_FILE)?.close()?;
        t.workers = Some(launcher.launch(id, target, &name, params)?);
        // find looks for files newer than this (taken before the first
        // write), on the coarse clock local file systems stamp mtimes with
        // (a precise reading can be a tick later than the mtime of a file
        // created right after it: on tmpfs find then missed the first
        // files); one ns earlier, since a file made within the same tick
        // has exactly this time
        t.start_ns = chfs_sys::coarse_realtime_ns() - 1;
        Ok(t)
    }

    /// `--prefault`: every rank touches its buffers and writes and
    /// deletes a file of `bytes`.
    fn prefault(&mut self, bytes: u64) -> Result<()> {
        let b = bar(self.opts, &self.label, "prefault", 0);
        let workers = self
            .workers
            .as_mut()
            .ok_or_else(|| BenchError::Config("workers gone".into()))?;
        let (ranks, secs) = workers.run(Work::Prefault(bytes), &[], b.as_ref())?;
        if let Some(b) = b {
            b.finish_and_clear();
        }
        if let Some(r) = ranks.iter().find(|r| r.bytes != bytes) {
            return Err(BenchError::Config(format!(
                "prefault wrote {} bytes, not {bytes}",
                r.bytes
            )));
        }
        self.prefault = Some(Prefault {
            bytes_per_rank: bytes,
            secs,
        });
        Ok(())
    }

    fn phase(&mut self, phase: Phase) -> Result<()> {
        let (params, n) = (self.params, self.params.nprocs);
        if phase == Phase::Find {
            let spec = FindSpec::io500(self.start_ns);
            let b = bar(self.opts, &self.label, phase.name(), 1);
            let cpu0 = self.fs.server_cpu_ns();
            let t0 = Instant::now();
            let found = self.fs.find("", &spec, n)?;
            let secs = t0.elapsed().as_secs_f64();
            let cpu = self
                .fs
                .server_cpu_ns()
                .zip(cpu0)
                .map(|(b, a)| b.saturating_sub(a));
            if let Some(b) = b {
                b.finish_and_clear();
            }
            let written = self.written.get(&Phase::MdtestHardWrite);
            let expected = pattern::expected_find(written.map(Vec::as_slice).unwrap_or(&[]), &spec);
            let nfound = found.matched.len() as u64;
            let valid = nfound == expected;
            let ex = found.examined;
            self.phases.push(
                PhaseResult::new(phase, ex, 0, secs, vec![ex], false, valid).with_server_cpu(cpu),
            );
            self.find = FindCheck {
                examined: ex,
                found: nfound,
                expected,
            };
            return Ok(());
        }
        let counts = phase
            .source()
            .and_then(|s| self.written.get(&s))
            .cloned()
            .unwrap_or_default();
        let expected_items: Option<u64> = phase.source().map(|_| counts.iter().sum());
        let max = match phase {
            Phase::IorEasyWrite => params.easy_max_segments,
            Phase::IorHardWrite => params.hard_max_records,
            Phase::MdtestEasyWrite => params.md_easy_max,
            Phase::MdtestHardWrite => params.md_hard_max,
            _ => 0,
        };
        let b = bar(
            self.opts,
            &self.label,
            phase.name(),
            expected_items.unwrap_or(max * n as u64),
        );
        let workers = self
            .workers
            .as_mut()
            .ok_or_else(|| BenchError::Config("workers gone".into()))?;
        let cpu0 = self.fs.server_cpu_ns();
        let (ranks, secs) = workers.run(Work::Io500(phase), &counts, b.as_ref())?;
        let cpu = self
            .fs
            .server_cpu_ns()
            .zip(cpu0)
            .map(|(b, a)| b.saturating_sub(a));
        if let Some(b) = b {
            b.finish_and_clear();
        }
        let items: Vec<u64> = ranks.iter().map(|r| r.items).collect();
        let bytes: u64 = ranks.iter().map(|r| r.bytes).sum();
        let stonewalled = ranks.iter().any(|r| r.stonewalled);
        let total: u64 = items.iter().sum();
        // Every consumer must have handled exactly what was written, and
        // moved the bytes that implies.
        let want_bytes = match phase {
            Phase::IorEasyWrite | Phase::IorEasyRead => total * params.easy_xfer as u64,
            Phase::IorHardWrite | Phase::IorHardRead => total * IOR_HARD_XFER as u64,
            Phase::MdtestHardWrite | Phase::MdtestHardRead => total * MD_HARD_SIZE as u64,
            _ => 0,
        };
        let valid = expected_items.is_none_or(|e| e == total) && bytes == want_bytes && total > 0;
        if phase.is_write() {
            self.written.insert(phase, items.clone());
        }
        self.phases.push(
            PhaseResult::new(phase, total, bytes, secs, items, stonewalled, valid)
                .with_series(&sum_series(&ranks))
                .with_warnings(phase, params)
                .with_server_cpu(cpu),
        );
        Ok(())
    }

    fn finish(mut self) -> Result<TargetResult> {
        let mut workers = self
            .workers
            .take()
            .ok_or_else(|| BenchError::Config("workers gone".into()))?;
        let (ranks, _) = workers.run(Work::OpenStorm, &[], None)?;
        drop(workers);
        let times: Vec<f64> = ranks.iter().map(|r| r.secs).collect();
        let open_storm = OpenStorm {
            ranks: self.params.nprocs,
            max_secs: times.iter().cloned().fold(0.0, f64::max),
            min_secs: times.iter().cloned().fold(f64::INFINITY, f64::min),
        };
        self.cleaned = true;
        if !self.opts.keep {
            self.fs.remove_all("")?;
        }
        let phases = std::mem::take(&mut self.phases);
        let bw: Vec<f64> = phases
            .iter()
            .filter(|p| p.kind == Kind::Bw)
            .map(|p| p.rate)
            .collect();
        let md: Vec<f64> = phases
            .iter()
            .filter(|p| p.kind == Kind::Md)
            .map(|p| p.rate)
            .collect();
        Ok(TargetResult {
            label: self.label.clone(),
            target: self.target.clone(),
            score: score::score(&bw, &md),
            phases,
            find: self.find,
            open_storm,
            prefault: self.prefault,
        })
    }
}

impl Drop for TargetRun<'_> {
    /// After a failure: stop the workers, then remove what was written.
    fn drop(&mut self) {
        self.workers = None;
        if !self.cleaned && !self.opts.keep {
            let _ = self.fs.remove_all("");
        }
    }
}

/// Runs the twelve phases (and the open storm) on every target, phase by
/// phase: each phase runs on the first target, then on the second, so
/// that the targets are measured side by side in time (a machine whose
/// load drifts affects both alike).
pub fn run_targets(
    targets: &[(&str, TargetSpec)],
    params: &Params,
    opts: &RunOptions,
    launcher: &dyn Launcher,
) -> Result<Vec<TargetResult>> {
    let mut runs = Vec::new();
    for (id, (label, t)) in targets.iter().enumerate() {
        runs.push(TargetRun::start(id, label, t, params, opts, launcher)?);
    }
    if params.prefault {
        let budget = mem_available().map(|m| rank_budget(m, params.nprocs, targets.len()));
        let bytes = prefault_bytes(params, budget);
        for r in &mut runs {
            r.prefault(bytes)?;
        }
    }
    for phase in Phase::ALL {
        for r in &mut runs {
            r.phase(phase)?;
        }
    }
    runs.into_iter().map(TargetRun::finish).collect()
}

/// Runs the twelve phases (and the open storm) on one target.
pub fn run_target(
    label: &str,
    target: &TargetSpec,
    params: &Params,
    opts: &RunOptions,
) -> Result<TargetResult> {
    let mut v = run_targets(&[(label, target.clone())], params, opts, &LocalLauncher)?;
    v.pop()
        .ok_or_else(|| BenchError::Config("no result".into()))
}

/// The ranks' per-second series added up, second by second (as long as
/// the longest).
pub fn sum_series(ranks: &[RankResult]) -> Vec<[u64; 2]> {
    let n = ranks.iter().map(|r| r.series.len()).max().unwrap_or(0);
    let mut out = vec![[0u64; 2]; n];
    for r in ranks {
        for (o, x) in out.iter_mut().zip(&r.series) {
            o[0] += x[0];
            o[1] += x[1];
        }
    }
    out
}

/// What `--prefault` writes per rank: what the run's write phases can
/// write per rank at most (its ior files and mdtest-hard's data), within
/// the rank's memory `budget` and what three phases could write before the
/// stonewall at [`RANK_BW_CEILING`].
pub fn prefault_bytes(p: &Params, budget: Option<u64>) -> u64 {
    let planned = p
        .easy_max_segments
        .saturating_mul(p.easy_xfer as u64)
        .saturating_add(p.hard_max_records.saturating_mul(IOR_HARD_XFER as u64))
        .saturating_add(p.md_hard_max.saturating_mul(MD_HARD_SIZE as u64));
    let cap = (3.0 * p.stonewall_secs * RANK_BW_CEILING) as u64;
    planned.min(budget.unwrap_or(u64::MAX)).min(cap)
}

/// The per-rank maxima of the four write phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Maxima {
    /// ior-easy: transfers per rank.
    pub easy_segments: u64,
    /// ior-hard: 47,008-byte records per rank.
    pub hard_records: u64,
    /// mdtest-easy: empty files per rank.
    pub easy_files: u64,
    /// mdtest-hard: 3,901-byte files per rank.
    pub hard_files: u64,
}

/// `--quick`: the stonewall (seconds) of a short CI run.
pub const QUICK_STONEWALL: f64 = 1.0;
/// The default stonewall (seconds); IO500's rules use 300.
pub const DEFAULT_STONEWALL: f64 = 30.0;
/// `--quick`: the small maxima of a CI run.
pub const QUICK_MAXIMA: Maxima = Maxima {
    easy_segments: 256,
    hard_records: 2000,
    easy_files: 20000,
    hard_files: 10000,
};
/// The fastest a rank is assumed to write (bytes/s): no phase is sized
/// beyond what it could write at this rate before the stonewall.
pub const RANK_BW_CEILING: f64 = 8.0 * (1u64 << 30) as f64;
/// The most files a rank is assumed to create per second (same use).
pub const RANK_MD_CEILING: f64 = 200_000.0;
/// Bytes of a target's memory one file is assumed to take besides its
/// data (its directory entry and metadata).
pub const FILE_OVERHEAD: u64 = 1024;

/// This machine's available memory (`MemAvailable` of /proc/meminfo), in
/// bytes.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&s)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A size with an optional K/M/G/T suffix (powers of 1024), as chfsd's
/// `--store-size` takes it.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 10),
        'm' | 'M' => (&s[..s.len() - 1], 20),
        'g' | 'G' => (&s[..s.len() - 1], 30),
        't' | 'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The memory one rank may fill on one target: a quarter of `available`
/// divided among the ranks and the targets (each target keeps what its
/// ranks wrote until the end of the run).
pub fn rank_budget(available: u64, nprocs: usize, targets: usize) -> u64 {
    available / 4 / (nprocs.max(1) * targets.max(1)) as u64
}

/// The maxima that fill at most `budget` bytes per rank (2/5 for each ior
/// phase, 3/20 for mdtest-hard's files, 1/20 for mdtest-easy's), each
/// capped by what a rank could write before the stonewall at
/// [`RANK_BW_CEILING`] or [`RANK_MD_CEILING`]; at least 1 each.
pub fn sized_maxima(budget: u64, stonewall: f64, xfer: usize) -> Maxima {
    let bw_cap = (stonewall * RANK_BW_CEILING) as u64;
    let md_cap = (stonewall * RANK_MD_CEILING) as u64;
    let ior = (budget / 5 * 2).min(bw_cap);
    Maxima {
        easy_segments: (ior / xfer.max(1) as u64).max(1),
        hard_records: (ior / IOR_HARD_XFER as u64).max(1),
        easy_files: (budget / 20 / FILE_OVERHEAD).min(md_cap).max(1),
        hard_files: (budget / 20 * 3 / (MD_HARD_SIZE as u64 + FILE_OVERHEAD))
            .min(md_cap)
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefault_writes_what_the_run_writes_within_memory() {
        let mut p = Params {
            nprocs: 2,
            stonewall_secs: 30.0,
            easy_xfer: 1 << 20,
            easy_max_segments: 100,
            hard_max_records: 10,
            md_easy_max: 1000,
            md_hard_max: 20,
            shift: 1,
            prefault: true,
            bind: false,
        };
        let planned = 100 * (1 << 20) + 10 * IOR_HARD_XFER as u64 + 20 * MD_HARD_SIZE as u64;
        assert_eq!(prefault_bytes(&p, None), planned);
        assert_eq!(prefault_bytes(&p, Some(planned + 1)), planned);
        assert_eq!(prefault_bytes(&p, Some(1 << 20)), 1 << 20);
        p.easy_max_segments = u64::MAX;
        p.stonewall_secs = 1.0;
        assert_eq!(prefault_bytes(&p, None), (3.0 * RANK_BW_CEILING) as u64);
    }

    #[test]
    fn series_add_up_second_by_second() {
        let rank = |series: Vec<[u64; 2]>| RankResult {
            series,
            ..Default::default()
        };
        let ranks = [
            rank(vec![[1, 10], [2, 20]]),
            rank(vec![[3, 30], [0, 0], [5, 50]]),
            rank(vec![]),
        ];
        assert_eq!(sum_series(&ranks), vec![[4, 40], [2, 20], [5, 50]]);
        assert!(sum_series(&[]).is_empty());
    }

    #[test]
    fn mem_available_and_sizes_parse() {
        let m = "MemTotal:       24684096 kB\nMemFree:        11674836 kB\nMemAvailable:   23844856 kB\n";
        assert_eq!(parse_mem_available(m), Some(23844856 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        // this machine has a /proc/meminfo
        assert!(mem_available().is_some_and(|m| m > 0));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn maxima_fill_a_quarter_of_memory_and_respect_the_stonewall() {
        // 16 GiB available, 2 ranks, system and reference: 1 GiB per rank
        // and target.
        let b = rank_budget(16 << 30, 2, 2);
        assert_eq!(b, 1 << 30);
        let m = sized_maxima(b, 300.0, 1 << 20);
        let ior = (1u64 << 30) / 5 * 2;
        assert_eq!(m.easy_segments, ior >> 20);
        assert_eq!(m.hard_records, ior / IOR_HARD_XFER as u64);
        assert_eq!(m.easy_files, (1 << 30) / 20 / FILE_OVERHEAD);
        // what the four phases write stays within the budget
        let bytes = m.easy_segments * (1 << 20)
            + m.hard_records * IOR_HARD_XFER as u64
            + m.easy_files * FILE_OVERHEAD
            + m.hard_files * (MD_HARD_SIZE as u64 + FILE_OVERHEAD);
        assert!(bytes <= b, "{bytes} > {b}");
        assert!(bytes > b / 10 * 9, "{bytes} uses too little of {b}");
        // a short stonewall caps what a huge memory would allow
        let m = sized_maxima(1 << 50, 0.5, 1 << 20);
        assert_eq!(m.easy_segments, (0.5 * RANK_BW_CEILING) as u64 >> 20);
        assert_eq!(m.easy_files, (0.5 * RANK_MD_CEILING) as u64);
        assert_eq!(m.hard_files, (0.5 * RANK_MD_CEILING) as u64);
        // nothing available: still one item per phase
        let m = sized_maxima(0, 30.0, 1 << 20);
        assert_eq!(
            m,
            Maxima {
                easy_segments: 1,
                hard_records: 1,
                easy_files: 1,
                hard_files: 1
            }
        );
    }
}
