//! chfsctl: create a chfs-rs file system on the nodes of a job, and tear it
//! down. `eval $(chfsctl -h hostfile -m /mnt start)`.

use std::path::PathBuf;
use std::time::Duration;

use chfs_ctl::ctl::CtlOptions;
use chfs_ctl::launch::{parse_hostfile, Launcher, LauncherKind};
use chfs_ctl::CtlError;
use clap::{Parser, ValueEnum};

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Action {
    /// Start chfsd on every host, wait until all joined, print the shell
    /// lines that set CHFS_SERVER (for eval).
    Start,
    /// Write back dirty data (cache mode), unmount, stop every server through the pool, wait until they exited
    /// (a recorded server whose recorded PID is not alive is not contacted; one that does not answer is
    /// stopped by its PID and named, exit status 1).
    Stop,
    /// Show every server: address, state, entries and bytes stored.
    Status,
    /// Stop every recorded server at once (SIGKILL by recorded PID).
    Kill,
    /// Remove the servers' files and the secret from the scratch directories.
    Clean,
    /// Move every file to the server that owns it by the pool's current list
    /// (done by -A after adding servers; run it again if that failed).
    Rebalance,
}

/// chfsctl — start, stop and inspect a chfs-rs pool on the hosts of a job.
///
/// Typical use in a batch job:
///   eval $(chfsctl -h $HOSTFILE -m /tmp/$USER/mnt start)
///   ... run the job (CHFS_SERVER and CHFS_SECRET_FILE are set) ...
///   chfsctl -h $HOSTFILE -m /tmp/$USER/mnt stop
///   chfsctl -h $HOSTFILE clean
///
/// start generates a secret for the pool (SCRATCH/chfs.secret, for the
/// servers and chfsctl) and a client key (SCRATCH/chfs.client.key), which
/// CHFS_SECRET_FILE names: only processes holding it reach the pool, and
/// they cannot stop it or change its membership. stop, status and
/// rebalance use the secret in the scratch directory (-c).
///
/// stop, status, kill and clean act on the servers recorded in the scratch
/// directory (-c) of the hosts (-h), and stop and status also on the pool
/// named by CHFS_SERVER; with nothing found they say "no server found" and
/// exit 1. They need the same -c and -h as start (-m to unmount); the
/// other options of start are not needed.
///
/// Exit status: 0 success, 1 a host or server failed (each error line names
/// it), 2 bad usage.
#[derive(Debug, Parser)]
#[command(
    name = "chfsctl",
    version,
    disable_help_flag = true,
    verbatim_doc_comment
)]
struct Args {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,

    /// Hostfile: one host per line (# comments, extra words such as slots=N
    /// ignored). Without it the pool is started on this host only.
    #[arg(short = 'h', long = "hostfile")]
    hostfile: Option<PathBuf>,

    /// Scratch directory on every host: pid, address and log files of the
    /// servers, the pool's secret. Default /tmp/$USER (without $USER, the
    /// name of the user running chfsctl). stop, status, kill and clean find
    /// the servers through it: give them the -c (and -h) of start.
    #[arg(short = 'c', long = "scratch")]
    scratch: Option<String>,

    /// Backend directory (cache mode): passed to chfsd as --backend and
    /// printed as CHFS_BACKEND_PATH.
    #[arg(short = 'b', long = "backend")]
    backend: Option<String>,

    /// Mount chfuse on this directory on every host (unmounted by stop/kill).
    #[arg(short = 'm', long = "mount")]
    mount: Option<String>,

    /// Do not mount (or unmount) even if -m is given.
    #[arg(short = 'M', long = "no-mount")]
    no_mount: bool,

    /// Add the hosts' servers to the running pool named by CHFS_SERVER.
    #[arg(short = 'A', long = "add")]
    add: bool,

    /// Protocol of the servers, as CHFS's -p: tcp (ours, the default;
    /// sockets is an alias) or a libfabric one (ofi+tcp, ofi+verbs,
    /// ofi+cxi, ofi+shm, ofi+efa, ofi+psm3, ofi+sockets): chfsd -p, and
    /// the servers are known (CHFS_SERVER) by their fabric addresses.
    #[arg(short = 'p', long = "protocol", default_value = "tcp")]
    protocol: String,

    /// Storage engine of the servers: mem (DRAM), pmem or posix (chfsd
    /// --store); a persistent store lives in the scratch directory.
    #[arg(long = "store")]
    store: Option<String>,

    /// Store size of every server (K, M, G, T suffixes); chfsd -s. Default:
    /// 1G for a new pmem store (as CHFS's chfsctl), no limit but memory or
    /// disk for mem and posix.
    #[arg(short = 's', long = "db-size")]
    db_size: Option<String>,

    /// Flush threads per server (cache mode); chfsd --flush-threads.
    #[arg(short = 'f', long = "flush-threads")]
    flush_threads: Option<u32>,

    /// Log directory on every host (default: the scratch directory).
    #[arg(short = 'L', long = "log-dir")]
    log_dir: Option<String>,

    /// Export VAR (with its value here) or VAR=value to the servers.
    /// Repeatable.
    #[arg(short = 'x', long = "export", value_name = "VAR[=value]")]
    export: Vec<String>,

    /// Extra chfsd options, as shell words (e.g. -O "--log-level debug").
    #[arg(short = 'O', long = "chfsd-options", allow_hyphen_values = true)]
    chfsd_opts: Option<String>,

    /// Bind the servers to these CPUs (taskset list, e.g. 0 or 0,1 or 0-3),
    /// keeping I/O service off the cores that compute.
    #[arg(short = 'C', long = "cpus")]
    cpus: Option<String>,

    /// Virtual server name (the original's consistent-hashing name). Not
    /// needed here: servers are placed by their unique host:port.
    #[arg(short = 'N', long = "vname")]
    vname: Option<String>,

    /// Servers per host.
    #[arg(short = 'n', long = "servers-per-host", default_value_t = 1)]
    per_host: usize,

    /// Start the pool without a secret: it is then open to every local and
    /// remote process that can reach its servers (a warning says so). By
    /// default start generates a pool secret (SCRATCH/chfs.secret, mode
    /// 0600, for the servers and chfsctl) and a client key
    /// (SCRATCH/chfs.client.key, printed as CHFS_SECRET_FILE for the job's
    /// processes).
    #[arg(long = "no-secret", conflicts_with = "secret")]
    no_secret: bool,

    /// Accepted for compatibility: a secret is the default (see
    /// --no-secret).
    #[arg(long = "secret")]
    secret: bool,

    /// How to reach the hosts (default: ssh with -h, this host directly
    /// without). srun runs job steps of the current allocation; without -h
    /// it starts a server on every node of the allocation.
    #[arg(long = "launcher", value_enum)]
    launcher: Option<LauncherKind>,

    /// Remote shell command of the ssh launcher.
    #[arg(long = "rsh", env = "CHFS_RSH", default_value = "ssh")]
    rsh: String,

    /// Port of the servers (0 = a free port chosen by each server).
    #[arg(long = "port", default_value_t = 0)]
    port: u16,

    /// chfsd binary on the hosts (default: chfsd next to chfsctl, else
    /// chfsd on the PATH).
    #[arg(long = "chfsd", env = "CHFSD")]
    chfsd: Option<String>,

    /// chfuse binary on the hosts (default: chfuse next to chfsctl, else
    /// chfuse on the PATH).
    #[arg(long = "chfuse", env = "CHFUSE")]
    chfuse: Option<String>,

    /// Seconds to wait for servers to start, join or stop, and for ssh to
    /// connect.
    #[arg(long = "timeout", default_value_t = 30)]
    timeout: u64,

    /// Report what is done on standard error; with status, also every
    /// counter of each server.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,

    /// start | stop | status | kill | clean | rebalance
    #[arg(value_enum)]
    action: Action,
}

fn sibling(name: &str) -> String {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(name)))
        .filter(|p| p.is_file())
        .map_or_else(|| name.to_string(), |p| p.to_string_lossy().into_owned())
}

/// `$USER`, else the name of this process's user (as the original's
/// `${USER:=$(id -un)}`), else its uid.
fn user() -> String {
    if let Some(u) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return u;
    }
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    // SAFETY: passwd is plain data (integers and pointers); all zeros is a
    // valid value that getpwuid_r overwrites.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 4096];
    let mut res: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pw, buf (of buf.len() bytes) and res are valid for the call;
    // on success res points to pw, whose strings live in buf.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut res) };
    if rc == 0 && !res.is_null() && !pw.pw_name.is_null() {
        // SAFETY: pw_name is a NUL-terminated string inside buf.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
        if let Ok(n) = name.to_str() {
            if !n.is_empty() {
                return n.to_string();
            }
        }
    }
    uid.to_string()
}

fn this_host() -> String {
    chfs_sys::hostname().unwrap_or_else(|_| "localhost".into())
}

/// The nodes of the current Slurm allocation (`scontrol show hostnames` of
/// `SLURM_JOB_NODELIST`).
fn allocation_nodes() -> Result<Vec<String>, CtlError> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            CtlError::Usage(
                "--launcher srun without -h starts a server on every node of the allocation, and SLURM_JOB_NODELIST is not set: give a hostfile (-h)".into(),
            )
        })?;
    let out = std::process::Command::new("scontrol")
        .args(["show", "hostnames", &list])
        .output()
        .map_err(|source| CtlError::Io {
            context: "running scontrol show hostnames (the allocation's nodes)".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(CtlError::Usage(format!(
            "scontrol show hostnames {list}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_hostfile(&String::from_utf8_lossy(&out.stdout))
}

/// `CHFS_RPC_TIMEOUT_MSEC`, read as clients read it (0: their default);
/// None when not set. A value that is not a number is a usage error.
fn rpc_timeout() -> Result<Option<Duration>, CtlError> {
    let Some(v) = std::env::var("CHFS_RPC_TIMEOUT_MSEC")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    chfs_client::ClientConfig::from_lookup(|k| (k == "CHFS_RPC_TIMEOUT_MSEC").then(|| v.clone()))
        .map(|c| Some(c.rpc_timeout))
        .map_err(|e| {
            CtlError::Usage(format!(
                "{}: CHFS_RPC_TIMEOUT_MSEC is the time in milliseconds after which a request to a server fails (0 = 30000); unset it or give a number",
                e.message()
            ))
        })
}

fn options(a: &Args) -> Result<CtlOptions, CtlError> {
    let protocol = match a.protocol.as_str() {
        "tcp" | "sockets" => None,
        p => match p.parse::<chfs_fabric::Protocol>() {
            Ok(p) => Some(p.name().to_string()),
            Err(e) => return Err(CtlError::Usage(format!("-p {p}: {e} (or tcp)"))),
        },
    };
    if let Some(v) = &a.vname {
        return Err(CtlError::Usage(format!(
            "-N {v}: virtual names are not used by chfs-rs (servers are placed by their unique host:port); drop -N"
        )));
    }
    if a.per_host == 0 {
        return Err(CtlError::Usage("-n must be at least 1".into()));
    }
    if a.launcher == Some(LauncherKind::Srun)
        && std::env::var_os("SLURM_JOB_ID").is_none()
        && std::env::var_os("SLURM_JOBID").is_none()
    {
        return Err(CtlError::Usage(
            "--launcher srun runs job steps of the current allocation, and SLURM_JOB_ID is not set: run chfsctl inside the job (sbatch script, salloc shell)".into(),
        ));
    }
    let (hosts, kind) = match (&a.hostfile, a.launcher) {
        (Some(f), kind) => {
            let text = std::fs::read_to_string(f).map_err(|source| CtlError::Io {
                context: format!("reading hostfile {}", f.display()),
                source,
            })?;
            (parse_hostfile(&text)?, kind.unwrap_or(LauncherKind::Ssh))
        }
        (None, Some(LauncherKind::Srun)) => (allocation_nodes()?, LauncherKind::Srun),
        (None, Some(kind)) => (vec![this_host()], kind),
        (None, None) => (vec![this_host()], LauncherKind::Local),
    };
    let mut exports = Vec::new();
    for x in &a.export {
        let (k, v) = match x.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => match std::env::var(x) {
                Ok(v) => (x.clone(), v),
                Err(_) => {
                    return Err(CtlError::Usage(format!(
                        "-x {x}: {x} is not set here (use -x {x}=value)"
                    )))
                }
            },
        };
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(CtlError::Usage(format!("-x {x}: not a variable name")));
        }
        exports.push((k, v));
    }
    let subdir = std::env::var("CHFS_SUBDIR_PATH")
        .ok()
        .filter(|s| !s.is_empty());
    if let Some(s) = &subdir {
        exports.push(("CHFS_SUBDIR_PATH".into(), s.clone()));
    }
    if let Some(b) = &a.backend {
        exports.push(("CHFS_BACKEND_PATH".into(), b.clone()));
    }
    let env = |k: &str| std::env::var(k).ok().filter(|s| !s.is_empty());
    Ok(CtlOptions {
        hosts,
        launcher: Launcher {
            kind,
            rsh: a.rsh.split_whitespace().map(String::from).collect(),
            connect_timeout: Duration::from_secs(a.timeout.clamp(1, 60)),
        },
        scratch: a
            .scratch
            .clone()
            .unwrap_or_else(|| format!("/tmp/{}", user())),
        log_dir: a.log_dir.clone(),
        backend: a.backend.clone(),
        subdir,
        mount: a.mount.clone(),
        no_mount: a.no_mount,
        add: a.add,
        store: a.store.clone(),
        db_size: a.db_size.clone(),
        flush_threads: a.flush_threads,
        exports,
        chfsd_opts: a.chfsd_opts.clone(),
        cpus: a.cpus.clone(),
        per_host: a.per_host,
        no_secret: a.no_secret,
        port: a.port,
        protocol,
        chfsd: a.chfsd.clone().unwrap_or_else(|| sibling("chfsd")),
        chfuse: a.chfuse.clone().unwrap_or_else(|| sibling("chfuse")),
        timeout: Duration::from_secs(a.timeout.max(1)),
        rpc_timeout: rpc_timeout()?,
        env_server: env("CHFS_SERVER"),
        env_secret_file: env("CHFS_SECRET_FILE"),
        env_secret: env("CHFS_SECRET"),
    })
}

fn run(a: &Args) -> Result<i32, CtlError> {
    let o = options(a)?;
    if a.verbose {
        eprintln!(
            "chfsctl: {:?} on {} host(s) via {:?}, scratch {}",
            a.action,
            o.hosts.len(),
            o.launcher.kind,
            o.scratch
        );
    }
    match a.action {
        Action::Start => {
            if o.no_secret {
                eprintln!("chfsctl: warning: --no-secret: the pool has no secret, so it is open to every local and remote process that can reach its servers: any of them can read, write and delete its files, and stop it");
            }
            print!("{}", o.start()?);
            Ok(0)
        }
        Action::Stop => {
            let r = o.stop(&mut |n| eprintln!("chfsctl: {n}"))?;
            if a.verbose {
                eprint!("{r}");
            }
            Ok(0)
        }
        Action::Status => {
            let (table, ok) = o.status(a.verbose)?;
            print!("{table}");
            Ok(if ok { 0 } else { 1 })
        }
        Action::Kill => o.kill().map(|_| 0),
        Action::Clean => {
            let r = o.clean()?;
            if a.verbose {
                eprint!("{r}");
            }
            Ok(0)
        }
        Action::Rebalance => {
            print!("{}", o.rebalance()?);
            Ok(0)
        }
    }
}

fn main() {
    let a = Args::parse();
    match run(&a) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            for line in e.to_string().lines() {
                eprintln!("chfsctl: {line}");
            }
            std::process::exit(e.exit_code());
        }
    }
}
