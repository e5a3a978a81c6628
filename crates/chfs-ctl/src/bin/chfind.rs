//! chfind: parallel find over the pool named by CHFS_SERVER.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::Instant;

use chfs_ctl::find::{find, Filter, SizeTest, TypeTest};
use chfs_ctl::CtlError;

const HELP: &str = "\
chfind — parallel find over the chfs-rs pool named by CHFS_SERVER

Usage: chfind [-q] [-v] [-j THREADS] [PATH...] [TEST...]

Every server's part of each directory is read with readdir-by-index, all
servers in parallel (THREADS threads; default 4 per server, at most 64).
Paths are chfs-rs paths (default /). All tests must pass (as find's -a):

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

fn run() -> Result<i32, CtlError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = parse(&args)?;
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
    let out = Mutex::new(std::io::BufWriter::with_capacity(
        1 << 16,
        std::io::stdout(),
    ));
    let quiet = o.quiet;
    let on_match = |p: &str| {
        if !quiet {
            let mut g = out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(g, "{p}");
        }
    };
    let t0 = Instant::now();
    let mut code = 0;
    let (mut seen, mut matched) = (0, 0);
    for p in &o.paths {
        let (st, errs) = find(&c, p, &o.filter, threads, &on_match);
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
    let el = t0.elapsed().as_secs_f64();
    let mut g = out.lock().unwrap_or_else(|p| p.into_inner());
    if quiet {
        let _ = writeln!(g, "MATCHED {matched}/{seen}");
    }
    let _ = g.flush();
    if o.verbose {
        eprintln!(
            "chfind: {seen} entries examined, {matched} matched, {el:.3} s, {:.0} entries/s, {threads} threads, {} servers",
            seen as f64 / el.max(1e-9),
            c.server_count()
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
