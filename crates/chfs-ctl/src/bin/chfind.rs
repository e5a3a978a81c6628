//! chfind: parallel find over the pool named by CHFS_SERVER.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::Instant;

use chfs_ctl::find::{find_ranked, Filter, SizeTest, TypeTest};
use chfs_ctl::rank::launcher_split;
use chfs_ctl::CtlError;

const HELP: &str = "\
chfind — parallel find over the chfs-rs pool named by CHFS_SERVER

Usage: chfind [-q] [-v] [-j THREADS] [PATH...] [TEST...]

The whole tree is listed at once, a request per server and page, all
servers in parallel; where a server does not serve that (older, cache
mode), every server's part of each directory is read with readdir-by-index
(THREADS threads; default 4 per server, at most 64). Paths are chfs-rs
paths (default /). All tests must pass (as find's -a):

  -name PATTERN   last component matches the shell pattern (fnmatch, as GNU find)
  -newer FILE     modified after FILE (FILE is looked up in chfs-rs first,
                  then on the local file system)
  -size [+-]N[bcwkMG]  size in units, rounded up, as GNU find (default unit:
                  512-byte blocks; c = bytes)
  -type f|d|l     regular file, directory, symbolic link

Options:
  -q              print only MATCHED <matches>/<entries examined>
  -v              print entries examined, time and entries/s on standard error
  -j THREADS      number of threads
  --help          this text
  --version       the version

Under mpirun or srun (chfind built with --features mpi), rank r of n
examines the entries of the servers whose index i has i % n == r and reads
only the directories of the others; rank 0 prints the matches of every rank
(at the end) or, with -q, the total. Built without it, chfind under mpirun
or srun fails. chfind is a rank only when the launcher started it: one
started by an MPI program (IO500's find phase runs it through popen) or a
batch script inherits the launcher's variables from its parent and runs as
one process. CHFS_MPI=0 (or CHFIND_MPI=0) forces one process, CHFS_MPI=1 a
rank (for mpirun -n N sh -c 'chfind ...').

Exit status: 0 success, 1 some directory could not be read (each error
names the server and directory), 2 bad usage or the pool cannot be reached.
";

struct Opts {
    paths: Vec<String>,
    filter: Filter,
    newer: Option<String>,
    quiet: bool,
    verbose: bool,
    threads: Option<usize>,
}

fn parse(args: &[String]) -> Result<Opts, CtlError> {
    let mut o = Opts {
        paths: Vec::new(),
        filter: Filter::default(),
        newer: None,
        quiet: false,
        verbose: false,
        threads: None,
    };
    let mut it = args.iter();
    let usage = |m: String| CtlError::Usage(m);
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("missing argument to {name}")))
        };
        match a.as_str() {
            "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--version" | "-V" => {
                println!("chfind {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-q" => o.quiet = true,
            "-v" => o.verbose = true,
            "-j" => {
                let v = val("-j")?;
                o.threads = Some(
                    v.parse()
                        .ok()
                        .filter(|&n: &usize| n > 0)
                        .ok_or_else(|| usage(format!("-j {v}: not a positive number")))?,
                );
            }
            "-name" => o.filter.set_name(&val("-name")?)?,
            "-newer" => o.newer = Some(val("-newer")?),
            "-size" => o.filter.size = Some(SizeTest::parse(&val("-size")?)?),
            "-type" => o.filter.ftype = Some(TypeTest::parse(&val("-type")?)?),
            s if s.starts_with('-') => {
                return Err(usage(format!(
                    "unknown option or test {s} (see chfind --help)"
                )))
            }
            p => {
                if o.filter.name.is_some()
                    || o.newer.is_some()
                    || o.filter.size.is_some()
                    || o.filter.ftype.is_some()
                {
                    return Err(usage(format!("path {p} must come before the tests")));
                }
                o.paths.push(p.to_string());
            }
        }
    }
    if o.paths.is_empty() {
        o.paths.push("/".into());
    }
    Ok(o)
}

/// Sums the counts and takes the largest exit status of all ranks on rank
/// 0 (and the longest time); the values are this rank's own otherwise.
#[cfg(feature = "mpi")]
fn reduce(world: &Option<mpi::topology::SimpleCommunicator>, v: [u64; 4]) -> [u64; 4] {
    use mpi::collective::SystemOperation;
    use mpi::traits::*;
    let Some(w) = world else { return v };
    let root = w.process_at_rank(0);
    let (sums, maxs) = ([v[0], v[1]], [v[2], v[3]]);
    let (mut s, mut m) = ([0u64; 2], [0u64; 2]);
    if w.rank() == 0 {
        root.reduce_into_root(&sums[..], &mut s[..], SystemOperation::sum());
        root.reduce_into_root(&maxs[..], &mut m[..], SystemOperation::max());
        [s[0], s[1], m[0], m[1]]
    } else {
        root.reduce_into(&sums[..], SystemOperation::sum());
        root.reduce_into(&maxs[..], SystemOperation::max());
        v
    }
}

/// Gathers the lines of every rank on rank 0 (mpirun forwards each rank's
/// standard output in chunks that can end inside a line, so ranks that
/// print at once would mix parts of lines). Returns the lines rank 0 must
/// print (its own and the others'); empty on the other ranks.
#[cfg(feature = "mpi")]
fn gather_lines(w: &mpi::topology::SimpleCommunicator, mut mine: Vec<u8>) -> Vec<u8> {
    use mpi::datatype::PartitionMut;
    use mpi::traits::*;
    // An empty Vec's pointer is 0x1, which MPI reads as MPI_IN_PLACE:
    // give every buffer a real allocation.
    mine.reserve(1);
    let root = w.process_at_rank(0);
    let len = mpi::Count::try_from(mine.len()).unwrap_or(mpi::Count::MAX);
    let mine = &mine[..len as usize];
    if w.rank() != 0 {
        root.gather_into(&len);
        root.gather_varcount_into(mine);
        return Vec::new();
    }
    let mut counts = vec![0 as mpi::Count; w.size() as usize];
    root.gather_into_root(&len, &mut counts[..]);
    let displs: Vec<mpi::Count> = counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect();
    let total: usize = counts.iter().map(|&c| c as usize).sum();
    let mut all = Vec::with_capacity(total + 1);
    all.resize(total, 0u8);
    let mut part = PartitionMut::new(&mut all[..], counts, &displs[..]);
    root.gather_varcount_into_root(mine, &mut part);
    all
}

/// Whole lines, written with one write(2) per batch; kept until the end
/// (`cap` 0) when rank 0 prints the lines of every rank.
struct LineOut {
    buf: Vec<u8>,
    cap: usize,
}

impl LineOut {
    fn line(&mut self, p: &str) {
        if self.cap > 0 && self.buf.len() + p.len() + 1 > self.cap {
            self.flush();
        }
        self.buf.extend_from_slice(p.as_bytes());
        self.buf.push(b'\n');
    }

    fn flush(&mut self) {
        if !self.buf.is_empty() {
            let _ = std::io::stdout().lock().write_all(&self.buf);
            let _ = std::io::stdout().flush();
            self.buf.clear();
        }
    }
}

fn run() -> Result<i32, CtlError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = parse(&args)?;
    let split = launcher_split()?;
    #[cfg(feature = "mpi")]
    let _universe;
    #[cfg(feature = "mpi")]
    let world = if split.ranks > 1 {
        use mpi::traits::*;
        _universe = mpi::initialize().ok_or_else(|| {
            CtlError::Usage("under mpirun, but MPI could not be initialised".into())
        })?;
        let w = _universe.world();
        let (r, n) = (w.rank() as usize, w.size() as usize);
        if (r, n) != (split.rank, split.ranks) {
            return Err(CtlError::Usage(format!(
                "MPI says rank {r} of {n}, the launcher's environment {} of {}",
                split.rank, split.ranks
            )));
        }
        Some(w)
    } else {
        None
    };
    #[cfg(not(feature = "mpi"))]
    if split.ranks > 1 {
        if split.rank == 0 {
            eprintln!(
                "chfind: under mpirun or srun ({} ranks), chfind must be built with `cargo build --features mpi` \
                 (rank 0 sums the counts and prints the matches of every rank); without it, run one \
                 chfind (its threads cover every server)",
                split.ranks
            );
        }
        return Ok(2);
    }
    let c = chfs_ctl::client_from_env().map_err(|e| CtlError::Usage(e.to_string()))?;
    if let Some(f) = &o.newer {
        let t = match c.lstat(f) {
            Ok(s) => s.mtime,
            Err(e) if e.errno() == libc::ENOENT || e.errno() == libc::EINVAL => {
                let m = std::fs::symlink_metadata(f).map_err(|source| CtlError::Io {
                    context: format!("-newer {f}: not in chfs-rs ({e}), nor here"),
                    source,
                })?;
                m.mtime() * 1_000_000_000 + m.mtime_nsec()
            }
            Err(source) => {
                return Err(CtlError::Client {
                    context: format!("-newer {f}"),
                    source,
                })
            }
        };
        o.filter.newer_than = Some(t);
    }
    let threads = o
        .threads
        .unwrap_or_else(|| (c.server_count() * 4).clamp(4, 64));
    let out = Mutex::new(LineOut {
        buf: Vec::new(),
        cap: if split.ranks > 1 { 0 } else { 1 << 16 },
    });
    let quiet = o.quiet;
    let on_match = |p: &str| {
        if !quiet {
            out.lock().unwrap_or_else(|p| p.into_inner()).line(p);
        }
    };
    let t0 = Instant::now();
    let mut code = 0;
    let (mut seen, mut matched) = (0, 0);
    for p in &o.paths {
        let (st, errs) = find_ranked(&c, p, &o.filter, threads, split, &on_match);
        seen += st.seen;
        matched += st.matched;
        for e in errs {
            code = 1;
            match e.server {
                Some(s) => eprintln!("chfind: server {s}: {}: {}", e.dir, e.error),
                None => eprintln!("chfind: {}: {}", e.dir, e.error),
            }
        }
    }
    #[cfg_attr(not(feature = "mpi"), allow(unused_mut))]
    let mut el = t0.elapsed().as_secs_f64();
    let mut g = out.lock().unwrap_or_else(|p| p.into_inner());
    #[cfg(feature = "mpi")]
    if let (Some(w), false) = (&world, quiet) {
        g.buf = gather_lines(w, std::mem::take(&mut g.buf));
    }
    g.flush();
    #[cfg(feature = "mpi")]
    {
        let v = reduce(&world, [seen, matched, code as u64, (el * 1e9) as u64]);
        (seen, matched, code, el) = (v[0], v[1], v[2] as i32, v[3] as f64 / 1e9);
    }
    if split.rank != 0 {
        // Rank 0 reports the totals (with MPI); the others only their
        // errors and exit status.
        return Ok(code);
    }
    if quiet {
        g.line(&format!("MATCHED {matched}/{seen}"));
        g.flush();
    }
    if o.verbose {
        eprintln!(
            "chfind: {seen} entries examined, {matched} matched, {el:.3} s, {:.0} entries/s, {threads} threads, {} servers, {} ranks",
            seen as f64 / el.max(1e-9),
            c.server_count(),
            split.ranks
        );
    }
    Ok(code)
}

fn main() {
    match run() {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("chfind: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
