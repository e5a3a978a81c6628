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
    // reply: of the requests that found their worker idle, most are
    // caught while polling. (One that arrives before the worker runs out
    // of work, as a quick caller's often does now that the reply is
    // written from the connection's reader, is neither: under load only
    // 146 of the 500 found a worker idle.)
    assert!(
        hits >= 50 && hits >= 3 * misses,
        "hits {hits}, misses {misses}"
    );
    assert!(after.cpu_ns > before.cpu_ns && after.cpu_ns > 0);
    p.stop();

    let p = pool_args(&["--poll-usec", "0"]);
    let addr = &p.addrs()[0];
    pings(addr, 200);
    let s = status(addr);
    assert_eq!((s.poll_hits, s.poll_misses), (0, 0));
    p.stop();
}

/// An idle server goes back to sleeping: after a burst of requests has
/// grown its workers' windows to a whole millisecond, two quiet seconds
/// cost it almost no CPU (a worker that kept polling, or woke up to poll,
/// would use a whole CPU).
#[test]
fn an_idle_server_stops_polling() {
    let p = pool_args(&["--poll-usec", "1000"]);
    let addr = &p.addrs()[0];
    pings(addr, 300);
    let (mut s, _, _) = hello(addr, b"");
    let cpu = |s: &mut std::net::TcpStream, id| match call(s, id, &Request::Status) {
        Ok(chfs_proto::Response::Status(st)) => st.cpu_ns,
        other => panic!("{other:?}"),
    };
    let before = cpu(&mut s, 1);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = cpu(&mut s, 2) - before;
    // Generous: 2% of one CPU over the 2 s (measured: nothing at all).
    assert!(
        used < 40_000_000,
        "an idle server used {used} ns of CPU in 2 s"
    );
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
