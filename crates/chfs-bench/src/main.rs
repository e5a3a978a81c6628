//! `chfs-bench`: IO500-style benchmark of chfs-rs against a reference, and
//! the package's other measurements as subcommands (demo, fuse, store,
//! store-servers, store-rss, cache).

use std::path::PathBuf;
use std::process::ExitCode;

use chfs_bench::leader::{self, Launcher, LocalLauncher, Maxima, RunOptions};
use chfs_bench::report::{self, RunResult};
use chfs_bench::worker::{Params, PoolCredential, TargetSpec};
use chfs_bench::{
    cache, demo, floor, fuse, scale, store, store_servers, sweep, BenchError, Result,
};
use chfs_client::Client;
use chfs_localpool::{LocalPool, PoolOptions};
use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "chfs-bench",
    version,
    about = "IO500-style benchmark of a chfs-rs pool or a directory, with a side-by-side reference; the demo, mount, storage-engine and cache-mode benchmarks as subcommands",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    io500: Io500Args,
}

impl Cli {
    /// Whether the run handles SIGINT, SIGTERM and SIGHUP itself
    /// ([`leader::install_signal_handlers`]): the IO500 phases and the
    /// sweep. The other subcommands keep the default disposition, so that
    /// a signal ends them at once (their servers and mounts, started in
    /// the same process group, get the terminal's signals too).
    fn handles_signals(&self) -> bool {
        matches!(self.cmd, None | Some(Cmd::Io500(_)) | Some(Cmd::Sweep(_)))
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The twelve IO500 phases (the default).
    Io500(Io500Args),
    /// Single-process bandwidth vs request size for several chunk sizes,
    /// pipelined chunk RPCs vs one at a time.
    Sweep(SweepArgs),
    /// The demo (scripts/demo.sh): a local pool, a verified workload
    /// through the native client and on a reference directory, side by
    /// side.
    Demo(demo::DemoArgs),
    /// A chfuse mount against the native client and a reference
    /// directory, on a local pool (needs chfuse and FUSE 3).
    Fuse(fuse::FuseArgs),
    /// The storage engines against the DRAM engine, at the store level
    /// (no server).
    Store(store::StoreArgs),
    /// The storage engines against the DRAM engine, through one chfsd
    /// each.
    StoreServers(store_servers::ServersArgs),
    /// The memory (RSS) of a POSIX-engine chfsd while GiBs pass through it.
    StoreRss(store_servers::RssArgs),
    /// Cache mode: stage-in and write-back against cp -r, and I/O-aware
    /// flushing (doc/cache-mode.md).
    Cache(cache::CacheArgs),
    /// The round-trip floor: socket ping-pong on one CPU and across CPUs,
    /// and a no-op request to a local chfsd on a CPU lane, its Unix socket
    /// and TCP.
    Floor(floor::FloorArgs),
    /// Many servers and client processes on this machine: open storms on
    /// one file and on one file each, mdtest-easy, and the requests,
    /// connections and memory of each server.
    Scale(scale::ScaleArgs),
    /// One client process of `scale` (started by it).
    #[command(hide = true)]
    ScaleWorker(scale::WorkerArgs),
}

#[derive(Args, Debug, Clone)]
struct Target {
    /// Start a local pool of N chfsd servers for the run (default: the
    /// pool in CHFS_SERVER).
    #[arg(long, value_name = "N", conflicts_with = "posix")]
    servers: Option<usize>,
    /// Benchmark this directory through POSIX calls instead of a pool.
    #[arg(long, value_name = "DIR")]
    posix: Option<PathBuf>,
    /// Storage engine of the local pool's servers: mem, pmem or posix (a
    /// persistent store per server on /dev/shm, of --store-size).
    #[arg(long, value_name = "ENGINE", requires = "servers")]
    store: Option<Engine>,
    /// Size of each server's persistent store (with --store or
    /// --reference-store pmem/posix; it must hold that server's share of
    /// the data written).
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    store_size: String,
    /// Start the local pool (--servers) without a secret: it is then open
    /// to every local and remote process that can reach its servers (a
    /// warning says so). By default a local pool gets a new secret and the
    /// ranks its client key.
    #[arg(long = "no-secret", requires = "servers")]
    no_secret: bool,
    /// Transport of the local pool's servers (chfsd -p): tcp, or a
    /// libfabric protocol such as ofi+tcp (a pool in CHFS_SERVER says its
    /// own in its addresses).
    #[arg(
        long,
        value_name = "PROTOCOL",
        default_value = "tcp",
        requires = "servers"
    )]
    protocol: String,
}

/// A chfsd storage engine (`chfsd --store`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Mem,
    Pmem,
    Posix,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Mem => "mem",
            Engine::Pmem => "pmem",
            Engine::Posix => "posix",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct Io500Args {
    #[command(flatten)]
    target: Target,
    /// Run the same phases on this directory and print ratios.
    #[arg(long, value_name = "DIR")]
    reference: Option<PathBuf>,
    /// Run the same phases on a second local pool of as many servers with
    /// this storage engine and print ratios (e.g. `--servers 2 --store
    /// pmem --reference-store mem`: each engine against DRAM, end to end).
    #[arg(
        long,
        value_name = "ENGINE",
        requires = "servers",
        conflicts_with = "reference"
    )]
    reference_store: Option<Engine>,
    /// Worker processes (ranks).
    #[arg(short = 'n', long, default_value_t = 2)]
    procs: usize,
    /// Seconds after which a write/create phase stops [default: 30; 1
    /// with --quick]; `--stonewall 300` for a rule-conforming IO500 run.
    #[arg(long, value_name = "SECS")]
    stonewall: Option<f64>,
    /// Small sizes for a run of a few seconds (CI, a first look): a 1 s
    /// stonewall and at most 256 transfers, 2,000 ior-hard records,
    /// 20,000 and 10,000 files per rank. Options given explicitly still
    /// apply.
    #[arg(long)]
    quick: bool,
    /// ior-easy transfer size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    transfer: usize,
    /// ior-easy: most transfers per rank [default: sized from the
    /// available memory (see the README); 256 with --quick].
    #[arg(long, value_name = "N")]
    easy_segments: Option<u64>,
    /// ior-hard: most 47,008-byte records per rank [default: sized from
    /// the available memory; 2000 with --quick].
    #[arg(long, value_name = "N")]
    hard_records: Option<u64>,
    /// mdtest-easy: most files per rank [default: sized from the
    /// available memory; 20000 with --quick].
    #[arg(long, value_name = "N")]
    easy_files: Option<u64>,
    /// mdtest-hard: most 3,901-byte files per rank [default: sized from
    /// the available memory; 10000 with --quick].
    #[arg(long, value_name = "N")]
    hard_files: Option<u64>,
    /// Rank r reads, stats and deletes what rank r+SHIFT wrote (IO500's
    /// -N; use the ranks per node so that data is read on another node;
    /// under MPI the default is the ranks on rank 0's node).
    #[arg(long, value_name = "SHIFT")]
    shift: Option<usize>,
    /// Before the phases, touch the memory the run will use: each rank's
    /// buffers, and the target's memory (each rank writes and deletes a
    /// file of what it will write, within the memory budget), so that no
    /// phase pays the first touch of never-used memory.
    #[arg(long)]
    prefault: bool,
    /// Write the JSON result here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG chart here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Keep the benchmark directories.
    #[arg(long)]
    keep: bool,
    /// No progress bars even on a terminal.
    #[arg(long)]
    no_progress: bool,
    /// Do not measure the round-trip floors (`chfs-bench floor`) before
    /// the phases (a few seconds; printed after the table, with each
    /// metadata phase's time per operation and rank).
    #[arg(long)]
    no_floor: bool,
    /// Ranks started by chfs-bench (not under MPI, whose launcher binds
    /// them): `core` runs each on one CPU of those chfs-bench may use, as
    /// `mpirun` binds ranks by default (its `--bind-to core`), and then
    /// the clients use CPU lanes; `none` lets them move. Default: `core`
    /// when there are no more ranks than CPUs, else `none`. The reference
    /// runs the same way.
    #[arg(long, value_name = "core|none", value_parser = ["core", "none"])]
    bind_to: Option<String>,
}

#[derive(Args, Debug, Clone)]
struct SweepArgs {
    /// Start a local pool of N chfsd servers (default: CHFS_SERVER).
    #[arg(long, value_name = "N")]
    servers: Option<usize>,
    /// Start the local pool (--servers) without a secret (see io500
    /// --no-secret).
    #[arg(long = "no-secret", requires = "servers")]
    no_secret: bool,
    /// Chunk sizes in bytes, separated by commas.
    #[arg(
        long,
        value_name = "BYTES,...",
        value_delimiter = ',',
        default_value = "4096,65536,524288"
    )]
    chunk_sizes: Vec<u32>,
    /// Request sizes in bytes, separated by commas.
    #[arg(
        long,
        value_name = "BYTES,...",
        value_delimiter = ',',
        default_value = "4096,65536,1048576,4194304"
    )]
    request_sizes: Vec<usize>,
    /// MiB written and read per point.
    #[arg(long, default_value_t = 16)]
    file_mib: u64,
    /// Repetitions of every point (medians are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Write the JSON result here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// The warning of a local pool started without a secret.
const OPEN_POOL_WARNING: &str = "chfs-bench: warning: --no-secret: the local pool has no secret, so it is open to every local and remote process that can reach its servers: any of them can read, write and delete its files, and stop it";

/// The pool to use: a fresh local one (with `store`: its servers' engine
/// and the size of each store; a new secret unless `no_secret`), or
/// CHFS_SERVER (with the environment's CHFS_SECRET_FILE / CHFS_SECRET).
fn pool(
    servers: Option<usize>,
    store: Option<(Engine, &str)>,
    no_secret: bool,
    protocol: &str,
) -> Result<(Option<LocalPool>, String, PoolCredential)> {
    match servers {
        Some(n) => {
            let mut opts = PoolOptions {
                servers: n,
                ..Default::default()
            };
            if protocol != "tcp" {
                opts.args = vec!["-p".into(), protocol.into()];
            }
            if !no_secret {
                opts = opts.with_new_secret();
            }
            if let Some((engine, size)) = store {
                opts.store = Some(engine.name().to_string());
                opts.store_size = size.to_string();
            }
            let p = LocalPool::start_with(opts)
                .map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
            let s = p.server_string();
            let cred = match p.client_key_file() {
                Some(k) => PoolCredential::File(k),
                None => PoolCredential::None,
            };
            Ok((Some(p), s, cred))
        }
        None => match std::env::var("CHFS_SERVER") {
            Ok(s) if !s.trim().is_empty() => Ok((None, s, PoolCredential::Env)),
            _ => Err(BenchError::Config(
                "no target: set CHFS_SERVER, or use --servers N (local pool) or --posix DIR".into(),
            )),
        },
    }
}

/// What the servers of a pool say they are: how many, and their storage
/// engines (as reported by each server's status, not as requested).
fn describe_pool(servers: &str, credential: &PoolCredential) -> Result<String> {
    let cfg = chfs_bench::worker::chfs_config(servers, credential)?;
    let client = Client::connect(cfg).map_err(|e| BenchError::chfs("connect", servers, e))?;
    let mut engines = std::collections::BTreeSet::new();
    let status = client.server_status();
    let n = status.len();
    for (addr, st) in status {
        let st = st.map_err(|e| BenchError::chfs("status", &addr, e))?;
        engines.insert(st.store);
    }
    let engines: Vec<String> = engines.into_iter().collect();
    Ok(format!(
        "chfs-rs pool of {n} servers, store {}",
        engines.join("+")
    ))
}

/// The stonewall: the option, or `--quick`'s, or the default.
fn stonewall_of(a: &Io500Args) -> f64 {
    a.stonewall.unwrap_or(if a.quick {
        leader::QUICK_STONEWALL
    } else {
        leader::DEFAULT_STONEWALL
    })
}

/// The per-rank maxima of a run: the options given, `--quick`'s small
/// ones, or sized from the available memory (a quarter of it among the
/// ranks and targets, within a local pool's persistent stores, no more
/// than the stonewall lets a rank write); says on stdout how it sized
/// them.
fn maxima(a: &Io500Args, procs: usize, targets: usize, stonewall: f64, mem: Option<u64>) -> Maxima {
    let given = [a.easy_segments, a.hard_records, a.easy_files, a.hard_files];
    let base = if a.quick || given.iter().all(Option::is_some) {
        leader::QUICK_MAXIMA
    } else {
        let mut budget = leader::rank_budget(mem.unwrap_or(4 << 30), procs, targets);
        let mut why = match mem {
            Some(m) => format!("a quarter of MemAvailable {:.1} GiB", gib(m)),
            None => "a quarter of an assumed 4 GiB (no MemAvailable)".into(),
        };
        let persistent = |e: Option<Engine>| matches!(e, Some(Engine::Pmem | Engine::Posix));
        if let (Some(servers), true, Some(size)) = (
            a.target.servers,
            persistent(a.target.store) || persistent(a.reference_store),
            leader::parse_size(&a.target.store_size),
        ) {
            let store = size.saturating_mul(servers as u64) / 4 * 3 / procs.max(1) as u64;
            if store < budget {
                budget = store;
                why = format!("3/4 of {servers} stores of {}", a.target.store_size);
            }
        }
        let m = leader::sized_maxima(budget, stonewall, a.transfer);
        println!(
            "sizes: up to {:.2} GiB per rank and target ({why}, {procs} ranks, {targets} targets)",
            gib(budget)
        );
        m
    };
    Maxima {
        easy_segments: a.easy_segments.unwrap_or(base.easy_segments),
        hard_records: a.hard_records.unwrap_or(base.hard_records),
        easy_files: a.easy_files.unwrap_or(base.easy_files),
        hard_files: a.hard_files.unwrap_or(base.hard_files),
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn write_file(path: &PathBuf, data: &str) -> Result<()> {
    std::fs::write(path, data).map_err(|e| BenchError::io("write", path.display(), e))
}

fn io500(
    a: Io500Args,
    launcher: &dyn Launcher,
    mpi_size: Option<usize>,
    default_shift: Option<usize>,
) -> Result<()> {
    let procs = mpi_size.unwrap_or(a.procs);
    if procs == 0 || a.transfer == 0 {
        return Err(BenchError::Config(
            "--procs and --transfer must be at least 1".into(),
        ));
    }
    let given = [a.easy_segments, a.hard_records, a.easy_files, a.hard_files];
    if given.contains(&Some(0)) {
        return Err(BenchError::Config(
            "--easy-segments, --hard-records, --easy-files and --hard-files must be at least 1"
                .into(),
        ));
    }
    let stonewall = stonewall_of(&a);
    if !(stonewall >= 0.0 && stonewall.is_finite()) {
        return Err(BenchError::Config(
            "--stonewall must be a number of seconds >= 0".into(),
        ));
    }
    for d in a.reference.iter().chain(a.target.posix.iter()) {
        if !d.is_dir() {
            return Err(BenchError::Config(format!(
                "{}: not a directory",
                d.display()
            )));
        }
    }
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (_pool, system) = match &a.target.posix {
        Some(dir) => (None, TargetSpec::Posix { dir: dir.clone() }),
        None => {
            let t = &a.target;
            if t.no_secret {
                eprintln!("{OPEN_POOL_WARNING}");
            }
            let (p, servers, credential) = pool(
                t.servers,
                t.store.map(|e| (e, t.store_size.as_str())),
                t.no_secret,
                &t.protocol,
            )?;
            (
                p,
                TargetSpec::Chfs {
                    servers,
                    credential,
                },
            )
        }
    };
    let ntargets = 1 + usize::from(a.reference.is_some() || a.reference_store.is_some());
    let m = maxima(&a, procs, ntargets, stonewall, leader::mem_available());
    let params = Params {
        nprocs: procs,
        stonewall_secs: stonewall,
        easy_xfer: a.transfer,
        easy_max_segments: m.easy_segments,
        hard_max_records: m.hard_records,
        md_easy_max: m.easy_files,
        md_hard_max: m.hard_files,
        shift: a.shift.or(default_shift).unwrap_or(1),
        prefault: a.prefault,
        bind: mpi_size.is_none()
            && match a.bind_to.as_deref() {
                Some(b) => b == "core",
                None => chfs_sys::cpu::allowed_count().is_ok_and(|n| procs <= n),
            },
    };
    let mut opts = RunOptions::auto();
    opts.progress &= !a.no_progress;
    opts.keep = a.keep;
    let mut targets = vec![("system", system)];
    if let Some(dir) = &a.reference {
        targets.push(("reference", TargetSpec::Posix { dir: dir.clone() }));
    }
    let mut _reference_pool = None;
    if let Some(engine) = a.reference_store {
        let (p, servers, credential) = pool(
            a.target.servers,
            Some((engine, &a.target.store_size)),
            a.target.no_secret,
            &a.target.protocol,
        )?;
        _reference_pool = p;
        targets.push((
            "reference",
            TargetSpec::Chfs {
                servers,
                credential,
            },
        ));
    }
    for (label, spec) in &targets {
        if let TargetSpec::Chfs {
            servers,
            credential,
        } = spec
        {
            println!("{label}: {}", describe_pool(servers, credential)?);
        }
    }
    let floors = (!a.no_floor)
        .then(|| measure_floors(&targets, params.nprocs))
        .transpose()?;
    let mut results = leader::run_targets(&targets, &params, &opts, launcher)?.into_iter();
    let (Some(sys), reference) = (results.next(), results.next()) else {
        return Err(BenchError::Config("no result".into()));
    };
    let run = RunResult {
        tool: "chfs-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        host: report::hostname(),
        started_unix,
        command: std::env::args().collect(),
        params,
        ratios: reference
            .as_ref()
            .map(|r| report::ratios(&sys, r))
            .unwrap_or_default(),
        system: sys,
        reference,
        floors,
    };
    print!("{}", report::table(&run));
    if let Some(p) = &a.json {
        write_file(p, &serde_json::to_string_pretty(&run)?)?;
    }
    if let Some(p) = &a.svg {
        write_file(p, &report::svg(&run))?;
    }
    let bad: Vec<&str> = run
        .system
        .phases
        .iter()
        .chain(run.reference.iter().flat_map(|r| r.phases.iter()))
        .filter(|p| !p.valid)
        .map(|p| p.name.as_str())
        .collect();
    if !bad.is_empty() {
        return Err(BenchError::Config(format!(
            "invalid phases: {}",
            bad.join(", ")
        )));
    }
    Ok(())
}

fn run_sweep(a: SweepArgs) -> Result<()> {
    if a.no_secret {
        eprintln!("{OPEN_POOL_WARNING}");
    }
    let (_pool, servers, credential) = pool(a.servers, None, a.no_secret, "tcp")?;
    let pts = sweep::sweep(
        &servers,
        &credential,
        &a.chunk_sizes,
        &a.request_sizes,
        a.file_mib << 20,
        a.reps,
    )?;
    print!("{}", sweep::table(&pts));
    if let Some(p) = &a.json {
        write_file(p, &serde_json::to_string_pretty(&pts)?)?;
    }
    Ok(())
}

/// `mpi`: the world size and the ranks on this node.
fn dispatch(cli: Cli, launcher: &dyn Launcher, mpi: Option<(usize, usize)>) -> Result<()> {
    let size = mpi.map(|m| m.0);
    // IO500 reads on another node: shift by the ranks per node if there
    // is more than one node.
    let shift = mpi.and_then(|(size, local)| (local > 0 && local < size).then_some(local));
    match cli.cmd {
        Some(Cmd::Io500(a)) => io500(a, launcher, size, shift),
        Some(Cmd::Sweep(a)) => run_sweep(a),
        Some(Cmd::Demo(a)) => demo::run(&a),
        Some(Cmd::Floor(a)) => floor::run(&a),
        Some(Cmd::Scale(a)) => scale::run(&a),
        Some(Cmd::ScaleWorker(a)) => scale::run_worker(&a),
        Some(Cmd::Fuse(a)) => fuse::run(&a),
        Some(Cmd::Store(a)) => store::run(&a),
        Some(Cmd::StoreServers(a)) => store_servers::engines(&a),
        Some(Cmd::StoreRss(a)) => store_servers::rss(&a),
        Some(Cmd::Cache(a)) => cache::run(&a),
        None => io500(cli.io500, launcher, size, shift),
    }
}

fn finish(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chfs-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Under `mpirun`/`srun`: rank 0 leads, the other ranks serve it.
#[cfg(feature = "mpi")]
fn mpi_main() -> ExitCode {
    use chfs_bench::mpi_ranks::MpiSession;
    let s = match MpiSession::init() {
        Ok(s) => s,
        Err(e) => return finish(Err(e)),
    };
    if s.rank() != 0 {
        return finish(s.serve());
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            s.quit_all();
            let _ = e.print();
            return ExitCode::from(e.exit_code() as u8);
        }
    };
    if cli.handles_signals() {
        leader::install_signal_handlers();
    }
    let size = s.size();
    let local = [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse::<usize>().ok())
    .unwrap_or(size);
    let r = dispatch(cli, &s, Some((size, local)));
    s.quit_all();
    finish(r)
}

/// The round-trip floors of this machine, and of the first pool among
/// `targets` (its first server); the stream ceilings of `nprocs`
/// connections at once.
fn measure_floors(targets: &[(&str, TargetSpec)], nprocs: usize) -> Result<floor::Floors> {
    let rounds = 5_000;
    let mut f =
        floor::Floors::transports(rounds).map_err(|e| BenchError::io("ping-pong", "socket", e))?;
    f.streams(nprocs, floor::STREAM_SECS)
        .map_err(|e| BenchError::io("streams", "socket", e))?;
    if let Some(TargetSpec::Chfs {
        servers,
        credential,
    }) = targets
        .iter()
        .map(|t| &t.1)
        .find(|t| matches!(t, TargetSpec::Chfs { .. }))
    {
        let cfg = chfs_bench::worker::chfs_config(servers, credential)?;
        f.rpcs(&cfg, 0, rounds)?;
    }
    Ok(f)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some(leader::WORKER_ARG) {
        return match chfs_bench::worker::worker_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chfs-bench worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    #[cfg(feature = "mpi")]
    if chfs_bench::mpi_ranks::launched_by_mpi() {
        return mpi_main();
    }
    let cli = Cli::parse();
    if cli.handles_signals() {
        leader::install_signal_handlers();
    }
    finish(dispatch(cli, &LocalLauncher, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn io500_of(args: &[&str]) -> Io500Args {
        let mut v = vec!["chfs-bench"];
        v.extend(args);
        Cli::try_parse_from(v).unwrap().io500
    }

    /// `--quick` gives the small CI sizes, explicit options win over both
    /// `--quick` and the memory-sized defaults, and the default stonewall
    /// is IO500-sized.
    #[test]
    fn quick_defaults_and_explicit_options() {
        let q = io500_of(&["--quick", "--hard-files", "7"]);
        assert_eq!(stonewall_of(&q), leader::QUICK_STONEWALL);
        let m = maxima(&q, 2, 2, stonewall_of(&q), Some(64 << 30));
        assert_eq!(
            m,
            Maxima {
                hard_files: 7,
                ..leader::QUICK_MAXIMA
            }
        );
        let d = io500_of(&["--easy-segments", "3"]);
        assert!(stonewall_of(&d) >= 30.0);
        let m = maxima(&d, 2, 1, stonewall_of(&d), Some(16 << 30));
        assert_eq!(m.easy_segments, 3);
        // 16 GiB available, 2 ranks, 1 target: 2 GiB per rank
        let sized = leader::sized_maxima(2 << 30, stonewall_of(&d), 1 << 20);
        assert_eq!(m.hard_records, sized.hard_records);
        assert_eq!(m.hard_files, sized.hard_files);
        let e = io500_of(&["--quick", "--stonewall", "4"]);
        assert_eq!(stonewall_of(&e), 4.0);
        // a persistent store bounds what is written: 2 stores of 64 MiB
        // hold 96 MiB of the run's data, 48 MiB per rank
        let s = io500_of(&["--servers", "2", "--store", "pmem", "--store-size", "64M"]);
        let m = maxima(&s, 2, 1, 30.0, Some(16 << 30));
        assert_eq!(m, leader::sized_maxima(48 << 20, 30.0, 1 << 20));
    }

    /// The defaults `sweep --help` shows are accepted back by the parser,
    /// and are the values used when the options are left out.
    #[test]
    fn sweep_help_shows_lists_the_parser_takes() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("sweep")
            .unwrap()
            .render_help()
            .to_string();
        let default_of = |opt: &str| -> String {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(opt))
                .unwrap_or_else(|| panic!("{opt} in {help}"));
            let d = line.split("[default: ").nth(1).expect("a default");
            d.trim_end().trim_end_matches(']').to_string()
        };
        let (chunks, requests) = (default_of("--chunk-sizes"), default_of("--request-sizes"));
        assert_eq!(chunks, "4096,65536,524288");
        let sweep_of = |args: &[&str]| match Cli::try_parse_from(args).unwrap().cmd {
            Some(Cmd::Sweep(s)) => s,
            other => panic!("{other:?}"),
        };
        let given = sweep_of(&[
            "chfs-bench",
            "sweep",
            "--chunk-sizes",
            &chunks,
            "--request-sizes",
            &requests,
        ]);
        let defaults = sweep_of(&["chfs-bench", "sweep"]);
        assert_eq!(given.chunk_sizes, vec![4096, 65536, 524288]);
        assert_eq!(given.request_sizes, vec![4096, 65536, 1 << 20, 4 << 20]);
        assert_eq!(defaults.chunk_sizes, given.chunk_sizes);
        assert_eq!(defaults.request_sizes, given.request_sizes);
        // A space-separated list (what the help showed before) is refused
        // with a message naming the option.
        let err = Cli::try_parse_from(["chfs-bench", "sweep", "--chunk-sizes", "4096 65536"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--chunk-sizes"), "{err}");
    }
}
