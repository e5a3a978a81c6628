//! The lookup cache keeps a large directory by the servers' directory
//! versions (`Request::DirVersion`) instead of relisting it every ttl:
//! lookups of missing names in a directory of more than 65,536 names are
//! answered without server lookups ttl after ttl, names created by others
//! are still found within ttl plus a check, and servers that do not keep
//! versions (older ones, cache mode) leave the cache as it was.

mod common;

use std::time::{Duration, Instant};

use chfs_client::Client;
use common::*;

const TTL: Duration = Duration::from_millis(300);
/// The client's `names::MAX_NAMES`: larger directories are not kept by
/// listings alone.
const MAX_NAMES: usize = 65536;

/// Makes `n` entries in `dir` (not through `c`'s cache: `c` is another
/// client), 4 threads at once.
fn fill(c: &Client, dir: &str, n: usize) {
    c.mkdir(dir, 0o755).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for i in (t..n).step_by(4) {
                    c.mknod(&format!("{dir}/f{i}"), libc::S_IFREG | 0o644, 0)
                        .unwrap();
                }
            });
        }
    });
}

/// Looks up missing names in `dir` until the lookups stop going to the
/// servers (the directory was listed into the cache); panics if they
/// never do.
fn until_listed(c: &Client, dir: &str) {
    for i in 0..100 {
        let before = c.stats().rpcs;
        assert_eq!(
            c.lookup(&format!("{dir}/warm{i}")).unwrap_err().errno(),
            libc::ENOENT
        );
        if c.stats().rpcs == before {
            return;
        }
    }
    panic!("{dir} never cached");
}

/// Lookups of missing names in `dir` for `dur`: (lookups, requests sent).
fn missing_lookups(c: &Client, dir: &str, dur: Duration) -> (u64, u64) {
    let (t, before) = (Instant::now(), c.stats().rpcs);
    let mut n = 0;
    while t.elapsed() < dur {
        let e = c.lookup(&format!("{dir}/none{n}")).unwrap_err();
        assert_eq!(e.errno(), libc::ENOENT);
        n += 1;
    }
    (n, c.stats().rpcs - before)
}

/// Polls `c`'s lookup of `p` until it is found; how long that took.
fn found_after(c: &Client, p: &str) -> Duration {
    let t = Instant::now();
    while c.lookup(p).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "{p} never found");
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed()
}

#[test]
fn a_directory_larger_than_a_listing_snapshot_is_kept_by_versions() {
    let p = LocalPool::start(2).expect("pool");
    let other = client(&p, |_| {});
    let n = MAX_NAMES + 500;
    fill(&other, "/big", n);
    let c = client(&p, |_| {});
    c.set_negative_ttl(TTL);
    until_listed(&c, "/big");
    // Four ttls of lookups of missing names: at most a check (a request
    // per server) per ttl, not a lookup each (before: every one went to
    // its server, the directory being too large to keep).
    let (lookups, rpcs) = missing_lookups(&c, "/big", TTL * 4);
    assert!(lookups > 1000, "{lookups} lookups");
    assert!(rpcs <= 2 * 6, "{rpcs} requests for {lookups} lookups");
    // Names present are still found (asked for: another client may have
    // changed them).
    other.truncate("/big/f7", 5).unwrap();
    std::thread::sleep(TTL);
    assert_eq!(c.lookup("/big/f7").unwrap().size, 5);

    // This client's creates, and between two checks another client's
    // create (on one of the servers of the own ones): found within ttl
    // and a check.
    for i in 0..8 {
        c.mknod(&format!("/big/own{i}"), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    assert!(c.lookup("/big/own3").is_ok());
    other
        .mknod("/big/foreign", libc::S_IFREG | 0o644, 0)
        .unwrap();
    let took = found_after(&c, "/big/foreign");
    assert!(
        took <= TTL + Duration::from_millis(500),
        "found after {took:?}"
    );
    // Removed by another client: gone within ttl and a check too.
    other.unlink("/big/f9").unwrap();
    let t = Instant::now();
    while c.lookup("/big/f9").is_ok() {
        assert!(t.elapsed() < TTL + Duration::from_millis(500));
        std::thread::sleep(Duration::from_millis(5));
    }
    // Absent -> present -> absent on a server by another client between
    // checks: no name is missed either way.
    other.mknod("/big/flip", libc::S_IFREG | 0o644, 0).unwrap();
    other.unlink("/big/flip").unwrap();
    other.mknod("/big/flop", libc::S_IFREG | 0o644, 0).unwrap();
    found_after(&c, "/big/flop");
    // Tracking started again (a listing) and keeps the directory.
    until_listed(&c, "/big");
    let (lookups, rpcs) = missing_lookups(&c, "/big", TTL * 3);
    assert!(rpcs <= 2 * 5, "{rpcs} requests for {lookups} lookups");
}

#[test]
fn servers_without_versions_leave_the_cache_as_it_was() {
    // One server answers DIR_VERSION as an older server does.
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--unknown-op".into(), "DIR_VERSION".into()],
        ..Default::default()
    })
    .expect("pool");
    let other = client(&p, |_| {});
    fill(&other, "/d", 100);
    let c = client(&p, |_| {});
    c.set_negative_ttl(TTL);
    until_listed(&c, "/d");
    other.mknod("/d/new", libc::S_IFREG | 0o644, 0).unwrap();
    let took = found_after(&c, "/d/new");
    assert!(
        took <= TTL + Duration::from_millis(500),
        "found after {took:?}"
    );
    // A large directory is not kept: lookups go to the servers.
    fill(&other, "/big", MAX_NAMES + 10);
    for i in 0..20 {
        let _ = c.lookup(&format!("/big/x{i}"));
    }
    let (lookups, rpcs) = missing_lookups(&c, "/big", TTL);
    assert!(rpcs >= lookups / 2, "{rpcs} requests for {lookups} lookups");
    assert!(c.readdir("/d").unwrap().len() == 101);
}

/// After ttl and a check, every name another client lists in `dir` is
/// found by `c` (no name that exists is called absent).
fn sees_all(c: &Client, other: &Client, dir: &str) {
    std::thread::sleep(TTL * 2);
    let all = other.readdir(dir).unwrap();
    assert!(!all.is_empty());
    for e in all {
        let p = format!("{dir}/{}", e.name);
        assert!(c.lookup(&p).is_ok(), "{p} called absent");
    }
}

#[test]
fn a_restarted_server_and_a_rebalance_end_what_versions_tell() {
    let mut p = LocalPool::start(2).expect("pool");
    let other = client(&p, |_| {});
    fill(&other, "/d", 300);
    let c = client(&p, |cfg| {
        cfg.node_list_cache_timeout = Duration::from_millis(100);
    });
    c.set_negative_ttl(TTL);
    until_listed(&c, "/d");
    let (_, rpcs) = missing_lookups(&c, "/d", TTL * 2);
    assert!(rpcs <= 2 * 4, "{rpcs} requests: not kept by versions");

    // A server restarted empty (DRAM), then names created again there
    // by another client: found.
    p.restart(1).unwrap();
    for i in 0..20 {
        other
            .mknod(&format!("/d/again{i}"), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    sees_all(&c, &other, "/d");
    until_listed(&c, "/d");

    // A server joins and a rebalance moves entries between servers; then
    // another client's creates: found.
    p.add_server().unwrap();
    let admin = client(&p, |_| {});
    assert_eq!(admin.servers().len(), 3);
    let r = admin.rebalance().unwrap();
    assert!(r.moved > 0 && r.failed == 0, "{r:?}");
    for i in 0..20 {
        admin
            .mknod(&format!("/d/moved{i}"), libc::S_IFREG | 0o644, 0)
            .unwrap();
    }
    sees_all(&c, &admin, "/d");
    // Kept by versions again once listed with the new list.
    until_listed(&c, "/d");
    let (_, rpcs) = missing_lookups(&c, "/d", TTL * 2);
    assert!(rpcs <= 3 * 4, "{rpcs} requests: not kept by versions");
}
