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
/// allocations stay in each thread's cache. Freed memory stays in the
/// heap for the next writes (glibc gives back the top of its heap only
/// past 512 MiB free there, and never the free memory within it); all of
/// it goes back to the system once the server is idle (`chfs_server`'s
/// `heap` module).
fn tune_malloc() {
    // SAFETY: mallopt only changes allocator parameters; called before any
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// `--huge-pages on` (off by default): starts this program again, in this
/// process, with `glibc.malloc.hugetlb=1` in GLIBC_TUNABLES, so that
/// glibc asks for transparent huge pages (madvise(MADV_HUGEPAGE)) on the
/// heap it grows; glibc reads tunables only when a program starts. Only
/// where the kernel gives huge pages to memory that asks (mode
/// `madvise`; with `always` every heap gets them anyway, with `never`
/// none does). Returns only when it did not start again: why, if the heap
/// stays on 4 KiB pages.
///
/// Started again (or when the administrator set the tunable to 1), it checks
/// that glibc took it, and if not starts again, at most [`HUGE_STARTS`]
/// times: glibc 2.35 and 2.36 (Debian 12, Ubuntu 22.04) compare the 23
/// bytes they read from the kernel's setting as a string without ending
/// it, so the tunable takes only when the stack byte after them happens
/// to be 0 (in 11 of 32 starts of chfsd here it was not).
///
/// Why: chunk data written to the DRAM store is new memory, held as long
/// as the file. With 4 KiB pages a write of new data costs chfsd a page
/// fault per 4 KiB; with 2 MiB pages one per 2 MiB (touching 1 GiB of
/// fresh 64 KiB buffers: 1.7-2.0 -> 6.1-6.3 GiB/s on the development VM).
/// Off by default: IO500 writes through the same-host path were slower
/// with it there (crates/chfs-bench/README.md).
fn huge_page_heap(cfg: &chfs_server::Config) -> Option<String> {
    use chfs_sys::heap::ThpMode;
    use std::os::unix::process::CommandExt;
    const TUNABLE: &str = "glibc.malloc.hugetlb";
    // How many times this program started itself again for the tunable.
    const STARTS: &str = "CHFSD_HUGE_PAGES_STARTS";
    if !cfg.huge_pages {
        return None;
    }
    match chfs_sys::heap::thp_mode() {
        ThpMode::Madvise => {}
        ThpMode::Always => return None,
        m => {
            return Some(format!(
                "the kernel gives no transparent huge pages (mode {m:?}): the heap stays on 4 KiB pages"
            ))
        }
    }
    let starts: u32 = std::env::var(STARTS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let now = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
    let now = now.to_string_lossy().into_owned();
    let named = now
        .split(':')
        .find_map(|t| t.strip_prefix(TUNABLE)?.strip_prefix('='));
    if named.is_some_and(|v| v != "1") {
        // The administrator's choice (2: hugetlbfs pages).
        return None;
    }
    let named = named.is_some();
    if named {
        match chfs_sys::heap::malloc_asks_huge_pages() {
            Some(false) if starts >= HUGE_STARTS => {
                return Some(format!(
                    "glibc did not take {TUNABLE} in {starts} starts: the heap stays on 4 KiB pages"
                ));
            }
            Some(false) => {}
            // Taken (or it cannot be told): the counter goes, so that
            // nothing this server starts inherits it.
            Some(true) | None => {
                std::env::remove_var(STARTS);
                return None;
            }
        }
    }
    // Under valgrind (its preload library in LD_PRELOAD), which follows no
    // exec by default: the program started again would run outside it.
    if std::env::var_os("LD_PRELOAD").is_some_and(|p| p.to_string_lossy().contains("vgpreload")) {
        return Some(
            "running under valgrind: not started again, the heap stays on 4 KiB pages".into(),
        );
    }
    let tunables = match (named, now.is_empty()) {
        (true, _) => now,
        (false, true) => format!("{TUNABLE}=1"),
        (false, false) => format!("{now}:{TUNABLE}=1"),
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    // The program's own path, so that its name stays `chfsd` (in ps,
    // pgrep, /proc/PID/comm); /proc/self/exe when the file is gone (a
    // rebuilt or reinstalled binary), which names it `exe`.
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "/proc/self/exe".into());
    // Nothing is open yet but the standard streams (and what the launcher
    // passed on), and no thread runs: the new image starts as this one did.
    let e = std::process::Command::new(exe)
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", tunables)
        .env(STARTS, (starts + 1).to_string())
        .exec();
    Some(format!(
        "could not start again with {TUNABLE}=1 ({e}): the heap stays on 4 KiB pages"
    ))
}

/// How many times chfsd starts itself again at most for glibc to take
/// `glibc.malloc.hugetlb` (with glibc 2.36 here a start took it in 21 of
/// 32: 16 starts all miss with a chance below 1 in 10^7).
const HUGE_STARTS: u32 = 16;

fn main() {
    let cfg = chfs_server::Config::parse();
    let no_huge_pages = huge_page_heap(&cfg);
    tune_malloc();
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
    if let Some(why) = no_huge_pages {
        tracing::warn!("{why}");
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
