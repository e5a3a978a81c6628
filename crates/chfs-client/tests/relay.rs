//! Relayed lookups (`CHFS_LOOKUP_LOCAL`, `CHFS_LOOKUP_RELAY_GROUP`) and
//! the contact servers' cache, through real pools: what an open storm
//! costs the owner of the file, what a reader sees of another client's
//! changes and of its own, and what a dead or hung contact does.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use chfs_client::flags::*;
use chfs_client::{Client, ClientConfig, Lookup};
use common::*;

/// `requests` of every server, by pool address.
fn requests(c: &Client) -> Vec<(String, u64)> {
    c.server_status()
        .into_iter()
        .map(|(a, s)| (a, s.expect("status").requests))
        .collect()
}

fn status(c: &Client, addr: &str) -> chfs_proto::msg::ServerStatus {
    c.server_status()
        .into_iter()
        .find(|(a, _)| a == addr)
        .map(|(_, s)| s.expect("status"))
        .expect("server in the list")
}

/// A client of `p` (with the pool's client key) whose lookups go by
/// `lookup`, choosing its contact by `seed`.
fn relayed(p: &LocalPool, lookup: Lookup, seed: u64, cache: Duration) -> Client {
    let key = p.client_key_file().map(|f| std::fs::read(f).unwrap());
    client(p, |c: &mut ClientConfig| {
        if let Some(k) = key {
            c.secret = String::from_utf8(k).unwrap().trim_end().as_bytes().to_vec();
        }
        c.lookup = lookup;
        c.contact_seed = Some(seed);
        c.lookup_cache = cache;
    })
}

/// 32 clients open and stat one file at once, on 8 servers: with relay
/// groups of 4 the file's owner serves the lookups of the 8 clients of
/// its own group plus at most two per other group (the first lookup a
/// contact sees is passed on without keeping its answer; then identical
/// lookups at a contact share one request, later ones are answered from
/// its cache), at most 64 / 4 + 2 x 3; without, all 64. The servers have a secret: the
/// contacts' requests to the owner are authenticated as servers.
#[test]
fn an_open_storm_costs_the_owner_clients_over_groups_plus_groups() {
    const CLIENTS: usize = 32;
    const LOOKUPS: u64 = 2 * CLIENTS as u64; // an open and a stat each
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 8,
            args: vec!["--lookup-cache-msec".into(), "30000".into()],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("pool");
    let admin = relayed(&p, Lookup::Direct, 0, Duration::ZERO);
    let fd = admin.create("/shared", O_WRONLY, 0o644).unwrap();
    admin.pwrite(fd, b"input", 0).unwrap();
    admin.close(fd).unwrap();
    // Requests each server served during a storm of `lookup` clients.
    let storm = |lookup: Lookup| -> Vec<u64> {
        let clients: Vec<Client> = (0..CLIENTS)
            .map(|r| relayed(&p, lookup, r as u64, Duration::from_secs(30)))
            .collect();
        let before = requests(&admin);
        let go = Arc::new(Barrier::new(CLIENTS));
        let threads: Vec<_> = clients
            .into_iter()
            .map(|c| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    let fd = c.open("/shared", O_RDONLY, 0).unwrap();
                    assert_eq!(c.stat("/shared").unwrap().size, 5);
                    c.close(fd).unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let after = requests(&admin);
        // (the status request itself adds one everywhere)
        before
            .iter()
            .zip(&after)
            .map(|((_, b), (_, a))| a - b - 1)
            .collect()
    };
    let direct = storm(Lookup::Direct);
    let owner = (0..direct.len()).max_by_key(|&i| direct[i]).unwrap();
    assert_eq!(direct[owner], LOOKUPS, "every lookup at the owner");
    let relayed = storm(Lookup::RelayGroup(4))[owner];
    assert!(
        relayed <= LOOKUPS / 4 + 2 * 3,
        "owner served {relayed} of {LOOKUPS} lookups with relay groups of 4"
    );
    // The contacts did the rest: lookups answered from their caches or by
    // a shared request.
    let st: Vec<_> = admin
        .server_status()
        .into_iter()
        .map(|(_, s)| s.unwrap())
        .collect();
    let lookups: u64 = st.iter().map(|s| s.lookups).sum();
    let forwards: u64 = st.iter().map(|s| s.lookup_forwards).sum();
    let hits: u64 = st.iter().map(|s| s.lookup_hits).sum();
    eprintln!(
        "owner of the file: {} requests direct, {relayed} with relay groups of 4; \
         contacts: {lookups} lookups, {hits} from the cache, {forwards} to owners",
        direct[owner]
    );
    assert!(lookups >= LOOKUPS - relayed, "{lookups}");
    assert!(forwards <= 2 * 3, "two per other group: {forwards}");
    assert!(hits > 0, "{hits}");
}

/// A path owned by another server than `c`'s contact (found by asking:
/// the contact's `lookup_forwards` grows for such a path).
fn path_relayed_by(c: &Client, contact: &str, prefix: &str) -> String {
    for i in 0.. {
        let path = format!("{prefix}{i}");
        let before = status(c, contact).lookup_forwards;
        let _ = c.stat(&path);
        if status(c, contact).lookup_forwards > before {
            return path;
        }
        assert!(i < 64, "no path relayed by {contact}");
    }
    unreachable!()
}

/// The consistency rule (SEMANTICS.md, "Relayed lookups"): a change made
/// by another client is seen by the lookups issued after it completed
/// (the owner tells the contacts that keep an answer about the entry
/// before it answers the change); the client's own changes too.
#[test]
fn changes_are_seen_through_a_contact_once_they_completed() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--lookup-cache-msec".into(), "30000".into()],
        ..Default::default()
    })
    .expect("pool");
    let ttl = Duration::from_secs(30);
    // Every server is on this host: seed 0 takes the first as contact.
    let b = relayed(&p, Lookup::Local, 0, ttl);
    let a = relayed(&p, Lookup::Direct, 0, ttl);
    let contact = b.servers()[0].clone();
    // b looked f up (absent: kept by the contact); a creates and writes
    // it: b sees it, with its size, at once.
    // (the first lookup of a path is passed to the owner and not kept,
    // the second is kept)
    let f = path_relayed_by(&b, &contact, "/other");
    let before = status(&b, &contact);
    assert_eq!(b.stat(&f).unwrap_err().errno(), libc::ENOENT);
    let after = status(&b, &contact);
    assert_eq!(after.lookup_hits, before.lookup_hits, "not kept at first");
    assert_eq!(after.lookup_forwards, before.lookup_forwards + 1);
    assert_eq!(b.stat(&f).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(
        status(&b, &contact).lookup_hits,
        after.lookup_hits + 1,
        "the absence is kept at the second lookup"
    );
    let fd = a.create(&f, O_WRONLY, 0o644).unwrap();
    a.pwrite(fd, b"12345", 0).unwrap();
    a.close(fd).unwrap();
    assert_eq!(b.stat(&f).unwrap().size, 5);
    let fd = b.open(&f, O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(b.pread(fd, &mut buf, 0).unwrap(), 5);
    b.close(fd).unwrap();
    // Grown by a's close (data beyond the first chunk: the size is
    // published at close), changed mode, then removed.
    let fd = a.open(&f, O_WRONLY, 0).unwrap();
    a.pwrite(fd, &[7u8; 100_000], 5).unwrap();
    a.close(fd).unwrap();
    assert_eq!(b.stat(&f).unwrap().size, 100_005);
    a.chmod(&f, 0o600).unwrap();
    assert_eq!(b.stat(&f).unwrap().mode & 0o777, 0o600);
    a.unlink(&f).unwrap();
    assert_eq!(b.stat(&f).unwrap_err().errno(), libc::ENOENT);
    // A rename by a: the old name gone, the new one there.
    let fd = a.create(&f, O_WRONLY, 0o644).unwrap();
    a.close(fd).unwrap();
    assert!(b.stat(&f).is_ok());
    let g = path_relayed_by(&b, &contact, "/renamed");
    a.rename(&f, &g).unwrap();
    assert_eq!(b.stat(&f).unwrap_err().errno(), libc::ENOENT);
    assert!(b.stat(&g).is_ok());
    // Its own changes: b looked h up (absent), then creates, writes,
    // changes and removes it: each seen at once.
    let h = path_relayed_by(&b, &contact, "/own");
    let fd = b.create(&h, O_RDWR, 0o644).unwrap();
    assert_eq!(b.stat(&h).unwrap().size, 0);
    b.pwrite(fd, b"abc", 0).unwrap();
    b.close(fd).unwrap();
    assert_eq!(b.stat(&h).unwrap().size, 3);
    b.chmod(&h, 0o600).unwrap();
    assert_eq!(b.stat(&h).unwrap().mode & 0o777, 0o600);
    b.unlink(&h).unwrap();
    assert_eq!(b.stat(&h).unwrap_err().errno(), libc::ENOENT);
}

/// A contact that is gone: lookups go to the owner. One that hangs:
/// ETIMEDOUT after the client's timeout, never a hang.
#[test]
fn a_dead_contact_is_passed_over_and_a_hung_one_times_out() {
    let mut p = LocalPool::start(2).expect("pool");
    let b = client(&p, |c| {
        c.lookup = Lookup::Local;
        c.contact_seed = Some(0);
        c.rpc_timeout = Duration::from_millis(1500);
    });
    let contact = b.servers()[0].clone();
    let path = path_relayed_by(&b, &contact, "/x");
    let a = client(&p, |_| {});
    let fd = a.create(&path, O_WRONLY, 0o644).unwrap();
    a.close(fd).unwrap();
    let i = p.addrs().iter().position(|s| *s == contact).unwrap();
    // Hung: an error in bounded time.
    p.signal(i, libc::SIGSTOP).unwrap();
    // (a signal is delivered asynchronously: until the process shows as
    // stopped, it may still answer)
    let pid = p.pid(i).unwrap();
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false)
    };
    let t = Instant::now();
    while !stopped() {
        assert!(t.elapsed() < Duration::from_secs(5), "server not stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    let r = b.stat(&format!("{path}.hung"));
    let waited = t.elapsed();
    p.signal(i, libc::SIGCONT).unwrap();
    let e = r.unwrap_err();
    assert_eq!(
        e.errno(),
        libc::ETIMEDOUT,
        "{e} after {waited:?}; owner and contact {:?}, contact {contact} = server {i} of {:?}",
        b.entry_servers(&format!("{path}.hung")),
        b.servers()
    );
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // Gone: the owner answers.
    p.kill(i);
    assert!(b.stat(&path).is_ok());
    let fd = b.open(&path, O_RDONLY, 0).unwrap();
    b.close(fd).unwrap();
}

/// With relay groups a client's lookups reach only the servers of its
/// group; it connects to other servers for their data only, and closes
/// connections idle for `CHFS_CONN_IDLE_SEC` when it opens another.
#[test]
fn a_relayed_client_connects_to_its_group_and_closes_idle_connections() {
    let p = LocalPool::start(4).expect("pool");
    let a = client(&p, |_| {});
    for i in 0..40 {
        let fd = a.create(&format!("/f{i}"), O_WRONLY, 0o644).unwrap();
        a.pwrite(fd, b"x", 0).unwrap();
        a.close(fd).unwrap();
    }
    let b = client(&p, |c| {
        c.lookup = Lookup::RelayGroup(2);
        c.contact_seed = Some(0);
        c.conn_idle = Duration::from_millis(300);
    });
    // Every server is local: seed 0 makes server 0 b's own, group 0.
    for i in 0..40 {
        assert_eq!(b.stat(&format!("/f{i}")).unwrap().size, 1);
    }
    let conns = b.connected_servers();
    assert!(
        !conns.is_empty() && conns.iter().all(|s| s % 2 == 0),
        "lookups reach group 0 only: {conns:?}"
    );
    // Data of a file owned by a server of the other group: a connection
    // to that owner.
    let owned_by = |odd_server: usize| {
        (0..40)
            .map(|i| format!("/f{i}"))
            .find(|f| b.entry_servers(f).unwrap().0 == odd_server)
            .expect("a file on that server")
    };
    let read = |f: &str| {
        let fd = b.open(f, O_RDONLY, 0).unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(b.pread(fd, &mut buf, 0).unwrap(), 1);
        b.close(fd).unwrap();
    };
    read(&owned_by(1));
    assert!(b.connected_servers().contains(&1));
    // Idle for longer than CHFS_CONN_IDLE_SEC: closed when the client
    // opens its next connection.
    std::thread::sleep(Duration::from_millis(400));
    read(&owned_by(3));
    let conns = b.connected_servers();
    assert!(conns.contains(&3) && !conns.contains(&1), "{conns:?}");
}

/// When the server list changes (a server joined), the former owner of
/// an entry tells the contacts keeping answers about it to drop them: the
/// new owner does not know those contacts, so a change made there is
/// seen through a contact at once only thanks to that.
#[test]
fn a_contact_is_told_when_an_entry_it_keeps_moves_to_a_new_owner() {
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--lookup-cache-msec".into(), "30000".into()],
        ..Default::default()
    })
    .expect("pool");
    let ttl = Duration::from_secs(30);
    // Every server is on this host: seed 0 takes the first as contact.
    let b = relayed(&p, Lookup::Local, 0, ttl);
    let contact = b.servers()[0].clone();
    let owned_by_1: Vec<String> = (0..200)
        .map(|i| format!("/m{i}"))
        .filter(|f| b.entry_servers(f).unwrap().0 == 1)
        .collect();
    // Looked up twice: the absence is kept by the contact (watched at 1).
    for f in &owned_by_1 {
        for _ in 0..2 {
            assert_eq!(b.stat(f).unwrap_err().errno(), libc::ENOENT);
        }
    }
    let hits = status(&b, &contact).lookup_hits;
    assert_eq!(b.stat(&owned_by_1[0]).unwrap_err().errno(), libc::ENOENT);
    assert_eq!(status(&b, &contact).lookup_hits, hits + 1, "kept");
    p.add_server().expect("join");
    let a = relayed(&p, Lookup::Direct, 0, ttl);
    assert_eq!(a.servers().len(), 3);
    let moved: Vec<&String> = owned_by_1
        .iter()
        .filter(|f| a.entry_servers(f).unwrap().0 == 2)
        .collect();
    assert!(!moved.is_empty(), "no path moved to the new server");
    for f in moved {
        let fd = a.create(f, O_WRONLY, 0o644).unwrap();
        a.close(fd).unwrap();
        assert!(b.stat(f).is_ok(), "{f}: created at its new owner");
    }
}

/// A path looked up once through a contact is not kept there, so its
/// owner remembers no contact for it and a change of it costs no
/// invalidation; a path looked up twice is kept, and its change costs one
/// `Invalidate` at the contact (seen in the contact's request count).
#[test]
fn a_path_looked_up_once_costs_no_watch_and_no_invalidation() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--lookup-cache-msec".into(), "30000".into()],
        ..Default::default()
    })
    .expect("pool");
    let ttl = Duration::from_secs(30);
    let b = relayed(&p, Lookup::Local, 0, ttl);
    let a = relayed(&p, Lookup::Direct, 0, ttl);
    let contact = b.servers()[0].clone();
    // (path_relayed_by looks each path up once)
    let once = path_relayed_by(&b, &contact, "/once");
    let twice = path_relayed_by(&b, &contact, "/twice");
    assert_eq!(b.stat(&twice).unwrap_err().errno(), libc::ENOENT);
    let fd = a.create("/warm", O_WRONLY, 0o644).unwrap();
    a.close(fd).unwrap();
    // Requests the contact served while `a` created `f` (but the status
    // request itself).
    let served_during_create = |f: &str| {
        let before = status(&b, &contact).requests;
        let fd = a.create(f, O_WRONLY, 0o644).unwrap();
        a.close(fd).unwrap();
        status(&b, &contact).requests - before - 1
    };
    let d_once = served_during_create(&once);
    let d_twice = served_during_create(&twice);
    assert_eq!(
        d_twice,
        d_once + 1,
        "one Invalidate, for the kept path only"
    );
    // Both seen at once.
    assert!(b.stat(&once).is_ok());
    assert!(b.stat(&twice).is_ok());
}
