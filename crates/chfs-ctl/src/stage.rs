//! The stage-in behind `chstagein` and `chfs stagein`: paths from the
//! arguments or standard input, shared out among the ranks of a launcher
//! ([`crate::rank`]) and staged by parallel threads with a progress bar
//! (the rule of what a path stands for is [`Client::stagein`]'s).

use std::io::{BufRead, IsTerminal};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use chfs_client::{Client, StageSource};

use crate::rank::RankSplit;
use crate::CtlError;

/// The command line of a stage-in: `chstagein`'s, and `chfs stagein`'s.
#[derive(Debug, clap::Args)]
pub struct StageArgs {
    /// Parallel stage-in threads (each file's chunks are also fetched in
    /// parallel by their servers).
    #[arg(short = 't', long, default_value_t = 8)]
    pub threads: usize,
    /// Print what was staged.
    #[arg(short, long)]
    pub verbose: bool,
    /// Read the paths from this file (one a line) instead; use it under
    /// `mpirun`, which gives standard input to rank 0 only.
    #[arg(short = 'f', long = "from")]
    pub from: Option<std::path::PathBuf>,
    /// Local paths, or paths of the pool (standard input when none, or
    /// where one is "-").
    pub paths: Vec<String>,
}

impl StageArgs {
    /// The paths to stage: those of the `--from` file and then the
    /// arguments, or without `--from` [`collect_paths`] of the arguments.
    pub fn paths(&self) -> Result<Vec<String>, CtlError> {
        let Some(f) = &self.from else {
            return Ok(collect_paths(&self.paths));
        };
        let text = std::fs::read_to_string(f).map_err(|source| CtlError::Io {
            context: format!("cannot read {}", f.display()),
            source,
        })?;
        Ok(text
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .chain(self.paths.iter().cloned())
            .collect())
    }
}

/// A stage-in tool's run (`chstagein`, `chfs stagein`): this process's
/// part of it by the launcher's rank rule ([`crate::rank::launcher_split`]),
/// staged with [`stagein_share`]. Returns the lines for standard error
/// (prefixed by `tool`, with `[RANK/RANKS]` when it is one of several
/// ranks: failures, and with `--verbose` what was staged; each to be
/// written at once, as ranks share the terminal) and the exit code.
pub fn run_tool(
    tool: &str,
    args: &StageArgs,
    connect: impl FnOnce() -> Result<Client, CtlError>,
) -> (Vec<String>, i32) {
    let fail = |e: CtlError| (vec![format!("{tool}: {e}\n")], e.exit_code());
    let split = match crate::rank::launcher_split() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let client = match connect() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let paths = match args.paths() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let start = std::time::Instant::now();
    let r = stagein_share(&client, &paths, args.threads, split);
    let who = if split.ranks > 1 {
        format!("{tool}[{}/{}]", split.rank, split.ranks)
    } else {
        tool.to_string()
    };
    let mut lines: Vec<String> = r
        .failures
        .iter()
        .map(|(p, e)| format!("{who}: {p}: {e}\n"))
        .collect();
    if args.verbose {
        let t = start.elapsed().as_secs_f64();
        lines.push(format!(
            "{who}: {} paths, {} bytes in {t:.2} s ({:.1} MiB/s)\n",
            r.paths,
            r.bytes,
            r.bytes as f64 / (1 << 20) as f64 / t.max(1e-9)
        ));
    }
    (lines, if r.failures.is_empty() { 0 } else { 1 })
}

/// Stages `paths` in as rank `split` of the processes sharing the work:
/// with more than one, this rank's share of them ([`rank_share`],
/// [`stage_items`]); alone, all of them ([`stagein`]).
pub fn stagein_share(
    client: &Client,
    paths: &[String],
    threads: usize,
    split: RankSplit,
) -> StageReport {
    if split.ranks <= 1 {
        return stagein(client, paths, threads);
    }
    let (share, failures) = rank_share(client, paths, split);
    let mut r = stage_items(client, &share, threads);
    r.failures.extend(failures);
    r
}

/// Outcome of a stage-in.
#[derive(Debug, Default)]
pub struct StageReport {
    /// Paths staged.
    pub paths: usize,
    /// Bytes staged.
    pub bytes: u64,
    /// Paths that failed, with the error.
    pub failures: Vec<(String, chfs_client::Error)>,
}

/// Reads paths from arguments, or from standard input when there are none
/// or one is `-` (one path a line, as from `find | chstagein`).
pub fn collect_paths(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let from_stdin = args.is_empty() || args.iter().any(|a| a == "-");
    for a in args.iter().filter(|a| *a != "-") {
        out.push(a.clone());
    }
    if from_stdin {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let l = line.trim_end();
            if !l.is_empty() {
                out.push(l.to_string());
            }
        }
    }
    out
}

/// One item of a stage-in: the path as given (or found below a given
/// directory), and where [`Client::stagein`]'s rule takes it from.
pub type StageItem = (String, StageSource);

/// The share of one rank of a stage-in of `paths`: each path is resolved
/// by [`Client::stagein`]'s rule, directories are expanded (every rank
/// lists them the same way: pool directories as the pool lists them, local
/// ones sorted by name) and rank r of n takes every n-th item from the
/// r-th ([`RankSplit::share`]), and so every n-th failure. A local
/// directory is an item of its own (created alone, with its mode) besides
/// the items below it.
pub fn rank_share(
    client: &Client,
    paths: &[String],
    split: RankSplit,
) -> (Vec<StageItem>, Vec<(String, chfs_client::Error)>) {
    let mut items = Vec::new();
    let mut failures = Vec::new();
    let mut todo: Vec<StageItem> = Vec::new();
    for p in without_covered(paths) {
        match client.stagein_source(&p, "/") {
            Ok(s) => todo.push((p, s)),
            Err(e) => failures.push((p, e)),
        }
    }
    todo.reverse();
    while let Some((label, source)) = todo.pop() {
        match source {
            StageSource::Backend(p) => match client.lstat(&p) {
                Ok(st) if st.is_dir() => match client.readdir(&p) {
                    Ok(list) => {
                        for e in list.into_iter().rev() {
                            let c = chfs_proto::path::join(&p, &e.name);
                            todo.push((c.clone(), StageSource::Backend(c)));
                        }
                    }
                    Err(e) => failures.push((label, e)),
                },
                Ok(_) => items.push((label, StageSource::Backend(p))),
                Err(e) => failures.push((label, e)),
            },
            StageSource::Local { src, dst, .. } => match local_children(&src) {
                Ok(Some(names)) => {
                    for n in names.into_iter().rev() {
                        let (s, d) = (src.join(&n), chfs_proto::path::join(&dst, &n));
                        let source = StageSource::Local {
                            src: s.clone(),
                            dst: d,
                            whole: true,
                        };
                        todo.push((s.display().to_string(), source));
                    }
                    let whole = false;
                    items.push((label, StageSource::Local { src, dst, whole }));
                }
                Ok(None) => items.push((
                    label,
                    StageSource::Local {
                        src,
                        dst,
                        whole: true,
                    },
                )),
                Err(e) => failures.push((label, e)),
            },
        }
    }
    (split.share(items), split.share(failures))
}

/// The names in a local directory, sorted (`None`: not a directory).
fn local_children(dir: &std::path::Path) -> Result<Option<Vec<String>>, chfs_client::Error> {
    let err = |e: std::io::Error| {
        chfs_client::Error::new(
            chfs_proto::error::io_errno(&e),
            format!("{}: {e}", dir.display()),
        )
    };
    if !std::fs::symlink_metadata(dir).map_err(err)?.is_dir() {
        return Ok(None);
    }
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(err)? {
        let name = e.map_err(err)?.file_name();
        match name.into_string() {
            Ok(n) => names.push(n),
            Err(n) => {
                return Err(chfs_client::Error::new(
                    libc::EINVAL,
                    format!("{}: not a UTF-8 name", dir.join(n).display()),
                ))
            }
        }
    }
    names.sort();
    Ok(Some(names))
}

/// Drops the paths that lie below another path of the list (`find DIR`
/// lists DIR and then its contents; staging DIR already fetches them all,
/// and counting them twice would overstate the bytes staged).
pub fn without_covered(paths: &[String]) -> Vec<String> {
    let norm = |p: &str| chfs_proto::path::normalize(p).unwrap_or_else(|_| p.to_string());
    let all: std::collections::HashSet<String> = paths.iter().map(|p| norm(p)).collect();
    paths
        .iter()
        .filter(|p| {
            let mut up = norm(p);
            while up != "/" {
                up = chfs_proto::path::parent(&up).to_string();
                if all.contains(&up) {
                    return false;
                }
            }
            true
        })
        .cloned()
        .collect()
}

/// Stages `paths` in with `threads` threads, each by [`Client::stagein`]'s
/// rule (a local file or directory is copied in, or fetched by the servers
/// when it lies in the backend directory; any other path is a path of the
/// pool, fetched from the backend); a progress bar is drawn only when
/// standard error is a terminal.
pub fn stagein(client: &Client, paths: &[String], threads: usize) -> StageReport {
    let mut items = Vec::new();
    let mut failures = Vec::new();
    for p in without_covered(paths) {
        match client.stagein_source(&p, "/") {
            Ok(s) => items.push((p, s)),
            Err(e) => failures.push((p, e)),
        }
    }
    let mut r = stage_items(client, &items, threads);
    r.paths = paths.len();
    failures.append(&mut r.failures);
    r.failures = failures;
    r
}

/// Stages resolved items in with `threads` threads (each item's chunks are
/// fetched by their owner servers in parallel); a progress bar is drawn
/// only when standard error is a terminal.
pub fn stage_items(client: &Client, items: &[StageItem], threads: usize) -> StageReport {
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(items.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} files {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((p, source)) = items.get(i) else {
                    break;
                };
                match client.stage(source) {
                    Ok(n) => {
                        let total = bytes.fetch_add(n, Ordering::Relaxed) + n;
                        if let Some(b) = &bar {
                            b.set_message(format!("{} MiB", total >> 20));
                        }
                    }
                    Err(e) => failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((p.clone(), e)),
                }
                if let Some(b) = &bar {
                    b.inc(1);
                }
            });
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    StageReport {
        paths: items.len(),
        bytes: bytes.into_inner(),
        failures: failures.into_inner().unwrap_or_else(|p| p.into_inner()),
    }
}

#[cfg(test)]
mod tests {
    use super::without_covered;

    #[test]
    fn paths_below_listed_directories_are_dropped() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            without_covered(&v(&["/in", "/in/a", "/in/b/c", "/other", "/inx/d", "in2/"])),
            v(&["/in", "/other", "/inx/d", "in2/"])
        );
        assert_eq!(without_covered(&v(&["/a/b", "/a/c"])), v(&["/a/b", "/a/c"]));
        assert_eq!(without_covered(&v(&["/", "/a"])), v(&["/"]));
    }
}
