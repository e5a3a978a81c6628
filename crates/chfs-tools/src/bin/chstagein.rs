//! chstagein: fetch files (or whole directories) from the backend into the
//! cache before a job reads them.

use clap::Parser;

/// Stage files and directories in from the backend (cache mode). Paths come
/// from the arguments, or from standard input (one a line) when there are
/// none or one is "-", e.g. `find /data -name '*.h5' | chstagein`.
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
    /// Paths in the file system's namespace.
    paths: Vec<String>,
}

fn main() {
    let a = Args::parse();
    let client = chfs_tools::connect_or_exit("chstagein");
    let paths = chfs_tools::collect_paths(&a.paths);
    let start = std::time::Instant::now();
    let r = chfs_tools::stagein(&client, &paths, a.threads);
    for (p, e) in &r.failures {
        eprintln!("chstagein: {p}: {e}");
    }
    if a.verbose {
        let t = start.elapsed().as_secs_f64();
        eprintln!(
            "chstagein: {} paths, {} bytes in {t:.2} s ({:.1} MiB/s)",
            r.paths,
            r.bytes,
            r.bytes as f64 / (1 << 20) as f64 / t.max(1e-9)
        );
    }
    std::process::exit(if r.failures.is_empty() { 0 } else { 1 });
}
