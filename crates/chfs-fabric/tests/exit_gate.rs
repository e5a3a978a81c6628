//! A process over `ofi+shm` that exits (`exit(3)`) while another of its
//! threads keeps calling into the provider: the library's exit hook
//! stops that thread at its gate before the process ends, so that it
//! cannot end holding one of the provider's locks in a peer's shared
//! queue (libfabric 1.17's shm provider keeps spin locks there, and a
//! server whose lock a dead client held spun forever: seen once in a
//! test of a C program that returns from `main` while a thread reads).
//!
//! Its own test binary: the child is this binary run again, and the gate
//! it closes is the whole process's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chfs_fabric::{Config, Endpoint, Protocol, BUILT_WITH_LIBFABRIC};

const CHILD: &str = "CHFS_EXIT_GATE_CHILD";

/// The other thread's rounds of calls into the provider so far.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Registered before the endpoint opens, so run after the library's
/// hook: says whether the other thread still gets through.
extern "C" fn after_the_hook() {
    // (A round under way when the gate closed may still end.)
    std::thread::sleep(Duration::from_millis(20));
    let a = CALLS.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    let b = CALLS.load(Ordering::SeqCst);
    let msg: &[u8] = if a == b {
        b"gate: stopped\n"
    } else {
        b"gate: running\n"
    };
    // SAFETY: writes a live buffer to standard output (no Rust stdout
    // machinery at exit).
    unsafe { libc::write(1, msg.as_ptr().cast(), msg.len()) };
}

fn child() {
    // SAFETY: registers a function of this binary taking no arguments.
    unsafe { libc::atexit(after_the_hook) };
    let ep = Arc::new(Endpoint::open(&Config::new(Protocol::Shm)).expect("open an shm endpoint"));
    let e = ep.clone();
    std::thread::spawn(move || loop {
        // (polls the queue for a millisecond: calls into the provider)
        let _ = e.progress(Duration::from_millis(1));
        CALLS.fetch_add(1, Ordering::SeqCst);
    });
    let t = Instant::now();
    while CALLS.load(Ordering::SeqCst) < 20 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the thread makes no calls"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::process::exit(0);
}

#[test]
fn an_exit_stops_the_other_threads_at_the_shm_gate() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    if !BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "an_exit_stops_the_other_threads_at_the_shm_gate",
            "built without libfabric (libfabric-dev)",
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let t = Instant::now();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "an_exit_stops_the_other_threads_at_the_shm_gate",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("gate: stopped"), "{stdout}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}
