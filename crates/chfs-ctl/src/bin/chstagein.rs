//! chstagein: put files (or whole directories) into the pool before a job
//! reads them: local ones are copied in, those of the backend (cache mode)
//! fetched by the servers.

use clap::Parser;

/// Stage files and directories into the pool. A path that exists here is
/// copied in at the same path (a relative one from the pool's root), or,
/// if it lies in the pool's backend directory (cache mode), fetched by the
/// servers from there (`cd BACKEND; find . | chstagein`); any other path
/// is a path of the pool, fetched from the backend. Paths come from the
/// arguments, or from standard input (one a line) when there are none or
/// one is "-", e.g. `find /data -name '*.h5' | chstagein`. Started by
/// `mpirun` or `srun`, every rank reads the same list and stages its share
/// of the files (directories are expanded first); started by a rank (a
/// shell or program the launcher ran), chstagein is one process staging
/// everything, unless CHFS_MPI=1 (CHFS_MPI=0: one process always).
#[derive(Parser)]
#[command(name = "chstagein", version)]
struct Args {
    /// Parallel stage-in threads (each file's chunks are also fetched in
    /// parallel by their servers).
    #[arg(short = 't', long, default_value_t = 8)]
    threads: usize,
    /// Print what was staged.
    #[arg(short, long)]
    verbose: bool,
    /// Read the paths from this file (one a line) instead; use it under
    /// `mpirun`, which gives standard input to rank 0 only.
    #[arg(short = 'f', long = "from")]
    from: Option<std::path::PathBuf>,
    /// Local paths, or paths of the pool (see above).
    paths: Vec<String>,
}

use chfs_ctl::stage;

fn main() {
    let a: Args = chfs_ctl::parse_args();
    // Under mpirun/srun every rank reads the same list and stages its share.
    let split = chfs_ctl::rank::launcher_split().unwrap_or_else(|e| {
        eprintln!("chstagein: {e}");
        std::process::exit(e.exit_code());
    });
    let client = chfs_ctl::client_from_env().unwrap_or_else(|e| {
        eprintln!("chstagein: {e}");
        std::process::exit(1);
    });
    let paths = match &a.from {
        Some(f) => match std::fs::read_to_string(f) {
            Ok(text) => text
                .lines()
                .map(str::trim_end)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .chain(a.paths.iter().cloned())
                .collect(),
            Err(e) => {
                eprintln!("chstagein: cannot read {}: {e}", f.display());
                std::process::exit(1);
            }
        },
        None => stage::collect_paths(&a.paths),
    };
    let start = std::time::Instant::now();
    let (r, who) = if split.ranks > 1 {
        let (share, failures) = stage::rank_share(&client, &paths, split);
        let mut r = stage::stage_items(&client, &share, a.threads);
        r.failures.extend(failures);
        (r, format!("chstagein[{}/{}]", split.rank, split.ranks))
    } else {
        (
            stage::stagein(&client, &paths, a.threads),
            "chstagein".to_string(),
        )
    };
    for (p, e) in &r.failures {
        let line = format!("{who}: {p}: {e}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    if a.verbose {
        let t = start.elapsed().as_secs_f64();
        // One write per line: ranks under mpirun share the terminal.
        let line = format!(
            "{who}: {} paths, {} bytes in {t:.2} s ({:.1} MiB/s)\n",
            r.paths,
            r.bytes,
            r.bytes as f64 / (1 << 20) as f64 / t.max(1e-9)
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    std::process::exit(if r.failures.is_empty() { 0 } else { 1 });
}
