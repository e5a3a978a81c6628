//! `--poll-usec`: a chfsd whose workers poll before they sleep catches the
//! next request while polling, counts it, and reports its CPU time; one
//! that does not poll counts nothing.

mod common;

use chfs_proto::Request;
use common::*;

/// Sends `n` no-op requests one after another (each waits for its reply,
/// as a synchronous caller does).
fn pings(addr: &str, n: u64) {
    let (mut s, st, msg) = hello(addr, b"");
    assert_eq!(st, 0, "{msg}");
    for id in 1..=n {
        call(&mut s, id, &Request::Ping).unwrap();
    }
}

#[test]
fn workers_poll_within_their_window_and_report_it() {
    let p = pool_args(&["--poll-usec", "2000"]);
    let addr = &p.addrs()[0];
    let before = status(addr);
    pings(addr, 500);
    let after = status(addr);
    let (hits, misses) = (
        after.poll_hits - before.poll_hits,
        after.poll_misses - before.poll_misses,
    );
    // The next request of a synchronous caller comes within 2 ms of the
    // reply: most are caught while polling.
    assert!(hits >= 250, "hits {hits}, misses {misses}");
    assert!(after.cpu_ns > before.cpu_ns && after.cpu_ns > 0);
    p.stop();

    let p = pool_args(&["--poll-usec", "0"]);
    let addr = &p.addrs()[0];
    pings(addr, 200);
    let s = status(addr);
    assert_eq!((s.poll_hits, s.poll_misses), (0, 0));
    p.stop();
}

#[test]
fn a_bad_poll_setting_is_refused() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_chfsd"))
        .args(["--poll-usec", "fast", "-h", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--poll-usec") && e.contains("auto"), "{e}");
}
