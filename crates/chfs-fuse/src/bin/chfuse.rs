//! `chfuse MOUNTPOINT [options]`: mounts the chfs-rs pool named by
//! `CHFS_SERVER` (and the other `CHFS_*` client variables). Runs in the
//! background unless `-f`; unmount with `fusermount3 -u MOUNTPOINT`,
//! `umount MOUNTPOINT`, or SIGINT/SIGTERM to the daemon.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chfs_fuse::{MountConfig, MountError};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "chfuse",
    version,
    about = "Mount a chfs-rs pool (CHFS_SERVER) with FUSE 3",
    after_help = "Unmount with `fusermount3 -u MOUNTPOINT` (or `umount`), or send SIGTERM.\n\
SIGUSR1 logs the kernel requests served so far, by opcode (also logged at unmount).\n\
Consistency between nodes: attributes and names may be cached by this node's kernel for\n\
--attr-timeout / --entry-timeout seconds; data written on another node is seen at open\n\
(page cache dropped at each open) once the writer has closed or fsynced."
)]
struct Args {
    /// Directory to mount on.
    mountpoint: PathBuf,
    /// Stay in the foreground.
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Debug logging (implies nothing about the foreground).
    #[arg(short = 'd', long)]
    debug: bool,
    /// Mount options, comma separated: allow_other, noallow_other,
    /// default_permissions, nodefault_permissions, ro, rw, writeback_cache,
    /// direct_io, page_cache, io_uring, no_io_uring, cpu_lanes, no_cpu_lanes, attr_timeout=SEC, entry_timeout=SEC,
    /// negative_timeout=SEC, max_threads=N.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
    /// Seconds the kernel caches attributes (0 = ask every time; most
    /// consistent between nodes).
    #[arg(long, default_value_t = 1.0)]
    attr_timeout: f64,
    /// Seconds the kernel caches names (0 = look up every path walk).
    #[arg(long, default_value_t = 1.0)]
    entry_timeout: f64,
    /// Seconds a name may be reported absent from a recent listing of its
    /// directory without asking its server, and a name found absent is
    /// kept as absent by the kernel (default: the entry timeout; 0 =
    /// always ask). Names created through this mount are always seen;
    /// one created on another node may stay invisible for this long.
    #[arg(long)]
    negative_timeout: Option<f64>,
    /// Kernel write-back cache (faster small writes; O_APPEND not atomic
    /// across nodes; data reaches the servers at close/fsync).
    #[arg(long)]
    writeback_cache: bool,
    /// Use the kernel page cache for file data (read-ahead, cached
    /// re-reads; data cached here is refreshed at each open). Default:
    /// direct I/O, 1 MiB requests straight to the servers.
    #[arg(long)]
    page_cache: bool,
    /// Threads serving kernel requests (0 = one per CPU, at least 2; on a
    /// 2-CPU node 2 threads created files 1.3-1.6x faster than 4, while
    /// several processes doing I/O at once did not care).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Serve requests through FUSE over io_uring when the kernel offers it
    /// (Linux 6.14+, `fuse.enable_uring=1`): per-CPU queues, each request
    /// handled on the CPU that issued it. `false` (or `-o no_io_uring`)
    /// always reads /dev/fuse.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    io_uring: bool,
    /// With io_uring: each ring thread reaches the servers on this host
    /// over its own connections, served there by a thread pinned to the
    /// same CPU, so a request and its reply stay on one CPU. `false` (or
    /// `-o no_cpu_lanes`) shares one connection per server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    cpu_lanes: bool,
    /// Kernel read-ahead in KiB (root only; 0 = kernel default of 128).
    #[arg(long, default_value_t = 1024)]
    read_ahead_kb: u32,
    /// Write the daemon's PID here once mounted (removed at unmount).
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// Log file of the background daemon (default: none; -f logs to stderr).
    #[arg(long)]
    log_file: Option<PathBuf>,
}

fn secs(name: &str, v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{name}={v:?} is not a number of seconds"))
}

fn build(args: &Args) -> Result<MountConfig, String> {
    let mut c = MountConfig::from_env(&args.mountpoint).map_err(|e| e.to_string())?;
    c.fs.attr_timeout = secs("attr_timeout", &args.attr_timeout.to_string())?;
    c.fs.entry_timeout = secs("entry_timeout", &args.entry_timeout.to_string())?;
    let mut negative = args.negative_timeout.map(|v| v.to_string());
    c.fs.writeback_cache = args.writeback_cache;
    c.fs.direct_io = !args.page_cache;
    c.fs.io_uring = args.io_uring;
    c.fs.cpu_lanes = args.cpu_lanes;
    if args.threads > 0 {
        c.threads = args.threads;
    }
    c.read_ahead_kb = args.read_ahead_kb;
    for o in &args.options {
        let (k, v) = o
            .split_once('=')
            .map_or((o.as_str(), None), |(k, v)| (k, Some(v)));
        match (k, v) {
            ("allow_other", None) => c.allow_other = true,
            ("noallow_other", None) => c.allow_other = false,
            ("default_permissions", None) => c.default_permissions = true,
            ("nodefault_permissions", None) => c.default_permissions = false,
            ("ro", None) => c.read_only = true,
            ("rw", None) => c.read_only = false,
            ("writeback_cache", None) => c.fs.writeback_cache = true,
            ("direct_io", None) => c.fs.direct_io = true,
            ("page_cache" | "kernel_cache", None) => c.fs.direct_io = false,
            ("io_uring", None) => c.fs.io_uring = true,
            ("no_io_uring", None) => c.fs.io_uring = false,
            ("cpu_lanes", None) => c.fs.cpu_lanes = true,
            ("no_cpu_lanes", None) => c.fs.cpu_lanes = false,
            ("attr_timeout", Some(v)) => c.fs.attr_timeout = secs(k, v)?,
            ("entry_timeout", Some(v)) => c.fs.entry_timeout = secs(k, v)?,
            ("negative_timeout", Some(v)) => negative = Some(v.to_string()),
            ("max_threads", Some(v)) => {
                c.threads = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("max_threads={v:?} is not a positive number"))?
            }
            ("", None) => {}
            _ => return Err(format!("unknown mount option {o:?}")),
        }
    }
    c.fs.negative_timeout = match negative {
        Some(v) => secs("negative_timeout", &v)?,
        None => c.fs.entry_timeout,
    };
    if c.fs.writeback_cache {
        // The write-back cache lives in the page cache.
        c.fs.direct_io = false;
    }
    if c.client.servers.is_empty() {
        return Err("CHFS_SERVER is not set (the address of a chfsd server)".into());
    }
    Ok(c)
}

fn init_log(args: &Args) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CHFUSE_LOG").unwrap_or_else(|_| {
        // fuser warns when its own unmount at exit finds the mount already
        // gone (after fusermount3 -u or a signal): not worth a warning.
        tracing_subscriber::EnvFilter::new(if args.debug {
            "debug"
        } else if args.foreground || args.log_file.is_some() {
            "info,fuser::session=error"
        } else {
            "warn,fuser::session=error"
        })
    });
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    if let Some(f) = &args.log_file {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(f)
        {
            Ok(file) => {
                b.with_ansi(false)
                    .with_writer(std::sync::Mutex::new(file))
                    .init();
                return;
            }
            Err(e) => eprintln!("chfuse: cannot open log file {}: {e}", f.display()),
        }
    }
    use std::io::IsTerminal;
    b.with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// Forks; the parent waits for the child's report and exits with it.
/// Returns the write end of the report pipe in the child.
fn daemonize() -> Result<std::fs::File, String> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe(2).
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created by pipe(2) and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no other threads exist yet (called before anything spawns).
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(r);
            // SAFETY: setsid has no memory effects; failure is harmless.
            unsafe { libc::setsid() };
            let _ = std::env::set_current_dir("/");
            Ok(std::fs::File::from(w))
        }
        _ => {
            drop(w);
            let mut msg = String::new();
            let _ = std::fs::File::from(r).read_to_string(&mut msg);
            if msg.starts_with("ok") {
                std::process::exit(0);
            }
            let msg = msg.trim();
            if msg.is_empty() {
                eprintln!("chfuse: the daemon exited before mounting");
            } else {
                eprintln!("chfuse: {msg}");
            }
            std::process::exit(1);
        }
    }
}

/// Points stdin/stdout/stderr at /dev/null (background daemon).
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of this process.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

fn main() -> ExitCode {
    // Keep freed 1 MiB request/reply buffers in the heap for reuse instead
    // of mapping and unmapping (page faulting) one per request.
    // SAFETY: mallopt only changes allocator parameters; no thread exists yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
    let mut args = Args::parse();
    if let Ok(abs) = std::path::absolute(&args.mountpoint) {
        args.mountpoint = abs;
    }
    let cfg = match build(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chfuse: {e}");
            return ExitCode::from(2);
        }
    };
    let mut report = if args.foreground {
        None
    } else {
        match daemonize() {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("chfuse: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    init_log(&args);
    let pid_file = args.pid_file.clone();
    let mut ready_report = report.take();
    let r = chfs_fuse::mount::serve(cfg, || {
        if let Some(p) = &pid_file {
            let _ = std::fs::write(p, format!("{}\n", std::process::id()));
        }
        if let Some(mut w) = ready_report.take() {
            let _ = w.write_all(b"ok\n");
            drop(w);
            detach_stdio();
        }
    });
    match r {
        Ok(()) => {
            // Unmounted: the PID file goes with the daemon (unless another
            // chfuse has written its own there since).
            if let Some(p) = &args.pid_file {
                let ours = format!("{}", std::process::id());
                if std::fs::read_to_string(p).is_ok_and(|s| s.trim() == ours) {
                    let _ = std::fs::remove_file(p);
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "chfuse failed");
            if let Some(mut w) = ready_report {
                let _ = writeln!(w, "{e}");
            } else if args.foreground {
                eprintln!("chfuse: {e}");
            }
            if let (Some(p), false) = (&args.pid_file, matches!(e, MountError::Client(_))) {
                let _ = std::fs::remove_file(p);
            }
            ExitCode::FAILURE
        }
    }
}
