//! chfsd: the chfs-rs server daemon.

use std::fs::File;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::FromRawFd;

use clap::Parser;

/// Detaches from the terminal and the launching session (`--daemon`).
///
/// Returns, in the background child, the write end of a pipe on which the
/// child reports "OK addr" or "ERR message". The foreground parent never
/// returns: it waits for that report, prints it and exits.
fn daemonize() -> File {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("chfsd: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    // SAFETY: called before any thread is started (no runtime exists yet),
    // so the child is a faithful single-threaded copy.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!("chfsd: fork: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    if pid > 0 {
        // SAFETY: fds[1] is the pipe's write end, owned here and closed once.
        unsafe { libc::close(fds[1]) };
        // SAFETY: fds[0] is the pipe's read end, owned by this File from now on.
        let mut rd = unsafe { File::from_raw_fd(fds[0]) };
        let mut msg = String::new();
        let _ = rd.read_to_string(&mut msg);
        if let Some(addr) = msg.strip_prefix("OK ") {
            print!("{addr}");
            let _ = std::io::stdout().flush();
            std::process::exit(0);
        }
        match msg.strip_prefix("ERR ") {
            Some(e) => eprint!("chfsd: {e}"),
            None => eprintln!("chfsd: the server exited before serving (see its log file)"),
        }
        std::process::exit(1);
    }
    // SAFETY: fds[0] is the read end, not used by the child.
    unsafe { libc::close(fds[0]) };
    // SAFETY: setsid has no memory effects; failure (already a leader) is harmless.
    unsafe { libc::setsid() };
    // SAFETY: the path is a NUL-terminated literal; dup2 onto the standard
    // descriptors, then the temporary descriptor is closed once.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            if null > 2 {
                libc::close(null);
            }
        }
    }
    // SAFETY: fds[1] is the write end, owned by this File from now on.
    unsafe { File::from_raw_fd(fds[1]) }
}

fn fail(notify: Option<File>, msg: String) -> ! {
    match notify {
        Some(mut f) => {
            let _ = writeln!(f, "ERR {msg}");
        }
        None => eprintln!("chfsd: {msg}"),
    }
    std::process::exit(1);
}

/// Keeps freed request buffers (up to a chunk each, many in flight) in the
/// heap for reuse: glibc would otherwise map and unmap every one above its
/// mmap threshold, a page fault per 4 KiB on each request. One arena for
/// all threads: chunk data is allocated by the thread that received it and
/// freed by whichever removes it, and with glibc's arena per thread the
/// memory a shared worker freed was of no use to a CPU lane's thread,
/// which faulted in fresh pages instead (writes through chfuse after the
/// native client: ~300 vs ~2,100 MiB/s on the development VM). Small
/// allocations stay in each thread's cache.
fn tune_malloc() {
    // SAFETY: mallopt only changes allocator parameters; called before any
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() {
    tune_malloc();
    let cfg = chfs_server::Config::parse();
    let notify = cfg.daemon.then(daemonize);
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match &cfg.log_file {
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .init(),
            Err(e) => fail(
                notify,
                format!("cannot open log file {}: {e}", path.display()),
            ),
        },
        // Colours only on a terminal: plain text into a pipe or a file
        // (a launcher's log, `2> file`).
        None => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
    }
    // The pipe is closed as soon as the server serves, so the foreground
    // process can exit.
    let notify = std::sync::Mutex::new(notify);
    let result = chfs_server::run_with_ready(cfg, |addr| {
        if let Some(mut f) = chfs_sys::lock(&notify).take() {
            let _ = writeln!(f, "OK {addr}");
        }
    });
    if let Err(e) = result {
        tracing::error!("{e}");
        fail(chfs_sys::lock(&notify).take(), e.to_string());
    }
}
