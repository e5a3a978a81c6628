//! One kind of operation M times through the native client, the Rust
//! twin of crates/chfs-capi/examples/capi_oploop.c (same arguments, same
//! set-up, same markers for strace, the loop in `oploop` for callgrind's
//! `--toggle-collect='*oploop*'`, `$OPLOOP_HOOK`), with a counting global allocator: it
//! prints `OP M us/op allocs/op` (allocations made by the loop, the
//! path strings it formats included: one per operation).
//!
//! Usage: oploop create|stat|unlink|read|write|small|hardwrite|unlinksmall|recwrite|hardread DIR N M
//! (the pool is `CHFS_SERVER`). `recwrite` is IOR-hard's write: M
//! records of 47,008 bytes one after the other; `hardread` is IOR-hard's
//! read by one of two ranks: M of N records written, every other one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use chfs_client::{flags, Client};

/// The system allocator, counting allocations.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RECORD: usize = 47_008;
const BIG: usize = 1 << 20;
const SMALL: usize = 3901;

fn main() {
    if let Err(e) = run() {
        eprintln!("oploop: {e}");
        std::process::exit(1);
    }
}

/// Runs `$OPLOOP_HOOK`, if set, with `OPLOOP_PHASE=phase` (as the C
/// loop does: e.g. `perf record` of the loop alone).
fn hook(phase: &str) {
    if let Ok(h) = std::env::var("OPLOOP_HOOK") {
        if !h.is_empty() {
            let st = std::process::Command::new("sh")
                .args(["-c", &h])
                .env("OPLOOP_PHASE", phase)
                .status();
            if !matches!(st, Ok(s) if s.success()) {
                eprintln!("OPLOOP_HOOK failed at {phase}");
            }
        }
    }
}

/// A marker for `strace -f` (the C loop's, the same paths).
fn marker(p: &std::ffi::CStr) {
    // SAFETY: `p` is a NUL-terminated string; access only reads it.
    unsafe { libc::access(p.as_ptr(), libc::F_OK) };
}

#[inline(never)]
fn oploop(
    c: &Client,
    op: &str,
    dir: &str,
    m: usize,
    fd: i32,
    buf: &mut [u8],
) -> chfs_client::Result<()> {
    for i in 0..m {
        let p = format!("{dir}/f{i}");
        match op {
            "create" => {
                let f = c.create(&p, flags::O_WRONLY, 0o644)?;
                c.close(f)?;
            }
            "stat" => {
                c.stat(&p)?;
            }
            "unlink" | "unlinksmall" => c.unlink(&p)?,
            "small" => {
                let f = c.open(&p, flags::O_RDONLY, 0)?;
                c.read(f, &mut buf[..SMALL])?;
                c.close(f)?;
            }
            "read" => {
                c.pread(fd, &mut buf[..RECORD], (i * RECORD) as u64)?;
            }
            // IOR-hard's read by one of two ranks: every other record.
            "hardread" => {
                c.pread(fd, &mut buf[..RECORD], ((2 * i + 1) * RECORD) as u64)?;
            }
            "hardwrite" => {
                let f = c.create(&p, flags::O_WRONLY, 0o644)?;
                c.write(f, &buf[..SMALL])?;
                c.close(f)?;
            }
            // IOR-hard's write: a record at a time, one after the other.
            "recwrite" => {
                c.pwrite(fd, &buf[..RECORD], (i * RECORD) as u64)?;
            }
            _ => {
                c.pwrite(fd, &buf[..BIG], (i * BIG) as u64)?;
            }
        }
    }
    Ok(())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: oploop create|stat|unlink|read|write|small|hardwrite|unlinksmall|recwrite|hardread DIR N M";
    let ops = [
        "create",
        "stat",
        "unlink",
        "read",
        "write",
        "small",
        "hardwrite",
        "unlinksmall",
        "recwrite",
        "hardread",
    ];
    if a.len() != 4 || !ops.contains(&a[0].as_str()) {
        return Err(usage.into());
    }
    let (op, dir) = (a[0].as_str(), a[1].as_str());
    let n: usize = a[2].parse()?;
    let m: usize = a[3].parse()?;
    if matches!(op, "stat" | "unlink" | "read" | "small" | "unlinksmall") && m > n {
        return Err(format!("{op}: M must be at most N").into());
    }
    if op == "hardread" && 2 * m > n {
        return Err("hardread: M must be at most N/2".into());
    }
    let c = Client::from_env()?;
    let _ = c.mkdir(dir, 0o755);
    let mut buf = vec![b'x'; BIG];
    let mut fd = -1;
    match op {
        "stat" | "unlink" | "small" | "unlinksmall" => {
            for i in 0..n {
                let f = c.create(&format!("{dir}/f{i}"), flags::O_WRONLY, 0o644)?;
                if op == "small" || op == "unlinksmall" {
                    c.write(f, &buf[..SMALL])?;
                }
                c.close(f)?;
            }
        }
        "read" | "hardread" => {
            let p = format!("{dir}/data");
            let f = c.create(&p, flags::O_WRONLY, 0o644)?;
            for i in 0..n {
                c.pwrite(f, &buf[..RECORD], (i * RECORD) as u64)?;
            }
            c.close(f)?;
            fd = c.open(&p, flags::O_RDONLY, 0)?;
        }
        "write" | "recwrite" => fd = c.create(&format!("{dir}/data"), flags::O_WRONLY, 0o644)?,
        _ => {}
    }
    hook("start");
    marker(c"/OPLOOP-START");
    let a0 = ALLOCS.load(Ordering::Relaxed);
    let r0 = c.stats().rpcs;
    let t = Instant::now();
    oploop(&c, op, dir, m, fd, &mut buf)?;
    let el = t.elapsed();
    let a1 = ALLOCS.load(Ordering::Relaxed);
    let r1 = c.stats().rpcs;
    marker(c"/OPLOOP-END");
    hook("end");
    let per = |x: f64| if m == 0 { 0.0 } else { x / m as f64 };
    println!(
        "{op} {m} {:.2} us/op {:.2} allocs/op {:.2} requests/op",
        per(el.as_secs_f64() * 1e6),
        per((a1 - a0) as f64),
        per((r1 - r0) as f64)
    );
    if fd >= 0 {
        c.close(fd)?;
    }
    Ok(())
}
