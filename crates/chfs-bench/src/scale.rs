//! `chfs-bench scale`: many servers and many client processes on this
//! machine, and what each server sees of them.
//!
//! A local pool of `--servers` chfsd and `--clients` client processes
//! (each a `chfs-bench scale-worker`, driven over its standard input and
//! output so that every phase starts in all of them at once) run:
//! - `open-shared`: every client opens (read-only) and closes one file:
//!   lookups only, all of one entry;
//! - `open-distinct`: every client opens and closes its own file;
//! - `storm-shared`: every client opens, stats and reads one file (the
//!   shared input of a job: the owner of its entry serves every client);
//! - `storm-distinct`: every client opens, stats and reads its own file
//!   (the same work spread over the servers);
//! - `mdtest-easy`: every client creates, stats and unlinks its files in
//!   its own directory.
//!
//! For each phase: its wall time, the slowest client's time, and the
//! requests the servers served (from `status`: the busiest server and the
//! total); after the phases, the connections each server holds and its
//! memory (RSS). The phases run once per lookup mode of `--lookup`
//! (direct, `CHFS_LOOKUP_LOCAL`, relay groups), each with new client
//! processes, so the figures show what relayed lookups and the contact
//! cache change.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use chfs_client::flags::{O_CREAT, O_RDONLY, O_RDWR};
use chfs_client::Client;
use chfs_localpool::{LocalPool, PoolOptions};
use clap::Args;

use crate::worker::{chfs_config, PoolCredential};
use crate::{BenchError, Result};

/// `chfs-bench scale`.
#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Servers in the local pool.
    #[arg(long, default_value_t = 32)]
    pub servers: usize,
    /// Client processes.
    #[arg(long, default_value_t = 128)]
    pub clients: usize,
    /// Files each client creates, stats and unlinks in mdtest-easy.
    #[arg(long, default_value_t = 100)]
    pub files: usize,
    /// Size of the files the storms read, bytes.
    #[arg(long, default_value_t = 4096)]
    pub size: usize,
    /// Lookup modes to run the phases in, comma separated: `direct`,
    /// `local` (CHFS_LOOKUP_LOCAL=1), `auto` (CHFS_LOOKUP_RELAY_GROUP_AUTO=1)
    /// or a group number N (CHFS_LOOKUP_RELAY_GROUP=N).
    #[arg(long, default_value = "direct,auto", value_delimiter = ',')]
    pub lookup: Vec<String>,
}

/// The client environment of a `--lookup` mode.
fn lookup_env(mode: &str) -> Result<Vec<(&'static str, String)>> {
    Ok(match mode {
        "direct" => vec![],
        "local" => vec![("CHFS_LOOKUP_LOCAL", "1".into())],
        "auto" => vec![("CHFS_LOOKUP_RELAY_GROUP_AUTO", "1".into())],
        n if n.parse::<u32>().is_ok_and(|g| g >= 2) => {
            vec![("CHFS_LOOKUP_RELAY_GROUP", n.into())]
        }
        other => {
            return Err(BenchError::Config(format!(
                "--lookup {other}: expected direct, local, auto or a group number >= 2"
            )))
        }
    })
}

/// `chfs-bench scale-worker` (started by `scale`; not for users).
#[derive(Args, Debug, Clone)]
pub struct WorkerArgs {
    /// This client's rank.
    #[arg(long)]
    pub rank: usize,
    /// Files in mdtest-easy.
    #[arg(long)]
    pub files: usize,
    /// Size of the storm files.
    #[arg(long)]
    pub size: usize,
}

const ROOT: &str = "/scale";

/// An I/O error of the scale run's processes and pipes.
fn io(what: &'static str) -> impl Fn(std::io::Error) -> BenchError {
    move |e| BenchError::io(what, "scale worker", e)
}

/// Opens, stats and reads `path` whole (`size` bytes).
fn open_stat_read(c: &Client, path: &str, size: usize) -> chfs_client::Result<()> {
    let fd = c.open(path, O_RDONLY, 0)?;
    let st = c.stat(path);
    let mut buf = vec![0u8; size];
    let r = c.pread(fd, &mut buf, 0);
    c.close(fd)?;
    let (st, n) = (st?, r?);
    if st.size != size as u64 || n != size {
        return Err(chfs_client::Error::new(
            libc::EIO,
            format!("{path}: {n} of {size} bytes read, size {}", st.size),
        ));
    }
    Ok(())
}

/// Opens `path` read-only and closes it.
fn open_close(c: &Client, path: &str) -> chfs_client::Result<()> {
    let fd = c.open(path, O_RDONLY, 0)?;
    c.close(fd)
}

/// One phase in one client.
fn phase(c: &Client, name: &str, a: &WorkerArgs) -> chfs_client::Result<()> {
    match name {
        "open-shared" => open_close(c, &format!("{ROOT}/shared")),
        "open-distinct" => open_close(c, &format!("{ROOT}/d{}", a.rank)),
        "storm-shared" => open_stat_read(c, &format!("{ROOT}/shared"), a.size),
        "storm-distinct" => open_stat_read(c, &format!("{ROOT}/d{}", a.rank), a.size),
        "mdtest-easy" => {
            let dir = format!("{ROOT}/m{}", a.rank);
            c.mkdir_all(&dir, 0o755)?;
            for i in 0..a.files {
                let p = format!("{dir}/f{i}");
                let fd = c.create(&p, O_RDWR | O_CREAT, 0o644)?;
                c.close(fd)?;
            }
            for i in 0..a.files {
                c.stat(&format!("{dir}/f{i}"))?;
            }
            for i in 0..a.files {
                c.unlink(&format!("{dir}/f{i}"))?;
            }
            Ok(())
        }
        other => Err(chfs_client::Error::new(
            libc::EINVAL,
            format!("unknown phase {other}"),
        )),
    }
}

/// Runs `chfs-bench scale-worker`: connects (configuration from the
/// environment the leader set), says `ready`, then for each phase name on
/// standard input runs it and answers `ok SECONDS` or `err MESSAGE`.
pub fn run_worker(a: &WorkerArgs) -> Result<()> {
    let c = chfs_client::ClientConfig::from_env()
        .map(|mut cfg| {
            // Spreads the clients over their candidate contact servers.
            cfg.contact_seed = Some(a.rank as u64);
            cfg
        })
        .and_then(Client::connect)
        .map_err(|e| BenchError::chfs("connect", "pool", e))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").map_err(io("write"))?;
    out.flush().map_err(io("write"))?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(io("read"))?;
        let t = Instant::now();
        match phase(&c, line.trim(), a) {
            Ok(()) => writeln!(out, "ok {}", t.elapsed().as_secs_f64()).map_err(io("write"))?,
            Err(e) => writeln!(out, "err {e}").map_err(io("write"))?,
        }
        out.flush().map_err(io("write"))?;
    }
    Ok(())
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.stdout.read_line(&mut l).map_err(io("read"))? == 0 {
            return Err(BenchError::Config("a scale worker exited".into()));
        }
        Ok(l.trim().to_string())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Requests each server has served so far and the CPU time it has used
/// (ns), in server order.
fn requests(c: &Client) -> Result<Vec<(u64, u64)>> {
    c.server_status()
        .into_iter()
        .map(|(a, s)| {
            s.map(|s| (s.requests, s.cpu_ns))
                .map_err(|e| BenchError::chfs("status", &a, e))
        })
        .collect()
}

/// One phase's figures.
#[derive(Debug, Clone)]
pub struct PhaseFigures {
    pub name: String,
    pub wall_secs: f64,
    pub slowest_secs: f64,
    /// Requests at the busiest server, and at all servers together.
    pub max_requests: u64,
    pub total_requests: u64,
    /// CPU time of all servers together, ns.
    pub server_cpu_ns: u64,
    /// Requests at the owner of the shared file (its phases only).
    pub owner_requests: Option<u64>,
    /// Connections of the server holding most after the phase (clients,
    /// peers; those of earlier phases included).
    pub max_connections: u64,
}

/// Runs `chfs-bench scale`.
pub fn run(a: &ScaleArgs) -> Result<()> {
    let pool = LocalPool::start_with(
        PoolOptions {
            servers: a.servers.max(1),
            ..Default::default()
        }
        .with_new_secret(),
    )
    .map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
    let cred = PoolCredential::of(&pool);
    let cfg = chfs_config(&pool.server_string(), &cred)?;
    let c = Client::connect(cfg).map_err(|e| BenchError::chfs("connect", "pool", e))?;
    let err = |what: &'static str| move |e| BenchError::chfs(what, ROOT, e);
    c.mkdir_all(ROOT, 0o755).map_err(err("mkdir"))?;
    let data = vec![0x5au8; a.size];
    for name in std::iter::once("shared".to_string()).chain((0..a.clients).map(|r| format!("d{r}")))
    {
        let fd = c
            .create(&format!("{ROOT}/{name}"), O_RDWR | O_CREAT, 0o644)
            .map_err(err("create"))?;
        c.pwrite(fd, &data, 0).map_err(err("write"))?;
        c.close(fd).map_err(err("close"))?;
    }
    println!(
        "chfs-bench scale: {} servers, {} client processes, {} files each in mdtest-easy, {}-byte storm files",
        a.servers, a.clients, a.files, a.size
    );
    for mode in &a.lookup {
        let env = lookup_env(mode)?;
        println!("\nlookups: {mode}");
        let (figures, conns, rss) = run_mode(a, &pool, &cred, &c, &env)?;
        print!("{}", table(&figures, &conns, &rss));
    }
    pool.stop();
    Ok(())
}

/// Figures of one lookup mode: the phases, the connections of each
/// server and its RSS (KiB) after them.
type ModeFigures = (Vec<PhaseFigures>, Vec<u64>, Vec<u64>);

/// Runs the phases with new client processes whose environment has
/// `env` (a lookup mode) besides the pool's.
fn run_mode(
    a: &ScaleArgs,
    pool: &LocalPool,
    cred: &PoolCredential,
    c: &Client,
    env: &[(&'static str, String)],
) -> Result<ModeFigures> {
    let exe = std::env::current_exe().map_err(io("find chfs-bench"))?;
    let mut workers = Vec::with_capacity(a.clients);
    for rank in 0..a.clients {
        let mut cmd = Command::new(&exe);
        cmd.args(["scale-worker", "--rank", &rank.to_string()])
            .args([
                "--files",
                &a.files.to_string(),
                "--size",
                &a.size.to_string(),
            ])
            .env_remove("CHFS_LOOKUP_LOCAL")
            .env_remove("CHFS_LOOKUP_RELAY_GROUP")
            .env_remove("CHFS_LOOKUP_RELAY_GROUP_AUTO")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("CHFS_SERVER", pool.server_string())
            .env_remove("CHFS_SECRET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        match &cred {
            PoolCredential::File(f) => {
                cmd.env("CHFS_SECRET_FILE", f);
            }
            _ => {
                cmd.env_remove("CHFS_SECRET_FILE");
            }
        }
        let mut child = cmd.spawn().map_err(io("start"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        workers.push(Worker {
            child,
            stdin,
            stdout,
        });
    }
    for w in &mut workers {
        let l = w.line()?;
        if l != "ready" {
            return Err(BenchError::Config(format!("scale worker: {l}")));
        }
    }
    let (owner, _) = c
        .entry_servers(&format!("{ROOT}/shared"))
        .map_err(|e| BenchError::chfs("placement", ROOT, e))?;
    let mut figures = Vec::new();
    for name in [
        "open-shared",
        "open-distinct",
        "storm-shared",
        "storm-distinct",
        "mdtest-easy",
    ] {
        let before = requests(c)?;
        let t = Instant::now();
        for w in &mut workers {
            writeln!(w.stdin, "{name}").map_err(io("write"))?;
            w.stdin.flush().map_err(io("write"))?;
        }
        let mut slowest = 0f64;
        for w in &mut workers {
            let l = w.line()?;
            match l.strip_prefix("ok ") {
                Some(s) => slowest = slowest.max(s.parse().unwrap_or(0.0)),
                None => return Err(BenchError::Config(format!("{name}: {l}"))),
            }
        }
        let wall = t.elapsed().as_secs_f64();
        let after = requests(c)?;
        let max_connections = c
            .server_status()
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.connections))
            .max()
            .unwrap_or(0);
        // (less the one status request each server answered in between)
        let d: Vec<u64> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.0.saturating_sub(b.0).saturating_sub(1))
            .collect();
        let cpu = after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.1.saturating_sub(b.1))
            .sum();
        figures.push(PhaseFigures {
            name: name.to_string(),
            wall_secs: wall,
            slowest_secs: slowest,
            max_requests: d.iter().copied().max().unwrap_or(0),
            total_requests: d.iter().sum(),
            server_cpu_ns: cpu,
            owner_requests: name.ends_with("-shared").then(|| d[owner]),
            max_connections,
        });
    }
    // While every client still holds its connections.
    let status = c.server_status();
    let conns: Vec<u64> = status
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.connections))
        .collect();
    let rss: Vec<u64> = (0..a.servers)
        .filter_map(|i| pool.pid(i))
        .map(rss_kib)
        .collect();
    drop(workers);
    // The servers see the workers' connections close.
    std::thread::sleep(std::time::Duration::from_millis(200));
    Ok((figures, conns, rss))
}

pub use chfs_localpool::rss_kib;

fn min_max(v: &[u64]) -> (u64, u64) {
    (
        v.iter().copied().min().unwrap_or(0),
        v.iter().copied().max().unwrap_or(0),
    )
}

/// The report.
pub fn table(f: &[PhaseFigures], conns: &[u64], rss_kib: &[u64]) -> String {
    let mut s = format!(
        "{:<16} {:>10} {:>13} {:>16} {:>8} {:>15} {:>14} {:>12}\n",
        "phase",
        "wall s",
        "slowest s",
        "busiest server",
        "owner",
        "all servers",
        "server us/req",
        "max conns"
    );
    for p in f {
        let per = p.server_cpu_ns as f64 / 1e3 / p.total_requests.max(1) as f64;
        let owner = p.owner_requests.map_or("-".to_string(), |n| n.to_string());
        s += &format!(
            "{:<16} {:>10.3} {:>13.3} {:>16} {:>8} {:>15} {:>14.1} {:>12}\n",
            p.name,
            p.wall_secs,
            p.slowest_secs,
            p.max_requests,
            owner,
            p.total_requests,
            per,
            p.max_connections
        );
    }
    let (cmin, cmax) = min_max(conns);
    let (rmin, rmax) = min_max(rss_kib);
    s += &format!("connections per server: {cmin}-{cmax}\n");
    s += &format!(
        "server RSS: {:.1}-{:.1} MiB\n",
        rmin as f64 / 1024.0,
        rmax as f64 / 1024.0
    );
    s
}
