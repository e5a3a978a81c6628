//! The client over a libfabric transport: chfsd processes started with
//! `-p ofi+tcp` advertise `ofi+tcp://IP:PORT` addresses, and a client
//! given one reaches every server over the fabric (doc/fabric.md).

mod common;

use std::time::{Duration, Instant};

use chfs_client::flags::*;
use common::*;

fn fabric_client(p: &LocalPool) -> chfs_client::Client {
    client(p, |c| c.secret = p.secret().unwrap().as_bytes().to_vec())
}

#[test]
fn every_request_works_over_ofi_tcp() {
    let Some(p) = fabric_pool(3, "every_request_works_over_ofi_tcp") else {
        return;
    };
    // The servers are known by their fabric addresses.
    for a in p.addrs() {
        assert!(a.starts_with("ofi+tcp://"), "{a}");
    }
    let c = fabric_client(&p);
    assert_eq!(c.servers().len(), 3);
    assert!(c.servers().iter().all(|s| s.starts_with("ofi+tcp://")));
    // Namespace.
    c.mkdir("/d", 0o755).unwrap();
    assert_eq!(c.mkdir("/d", 0o755).unwrap_err().errno(), libc::EEXIST);
    for i in 0..20 {
        let fd = c.create(&format!("/d/f{i}"), O_WRONLY, 0o600).unwrap();
        c.write(fd, format!("file {i}").as_bytes()).unwrap();
        c.close(fd).unwrap();
    }
    let mut names: Vec<_> = c
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(names.len(), 20);
    assert_eq!(c.stat("/d/f7").unwrap().size, 6);
    c.rename("/d/f7", "/d/seven").unwrap();
    assert_eq!(c.stat("/d/f7").unwrap_err().errno(), libc::ENOENT);
    let fd = c.open("/d/seven", O_RDONLY, 0).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(c.read(fd, &mut b).unwrap(), 6);
    assert_eq!(&b[..6], b"file 7");
    c.close(fd).unwrap();
    c.unlink("/d/seven").unwrap();
    assert_eq!(c.stat("/d/seven").unwrap_err().errno(), libc::ENOENT);
    // Large files of many chunks, on every server, the default chunk size
    // (64 KiB, a chunk and its request in one message) and small ones.
    for (cs, len) in [(None, 5 << 20), (Some(4096), 300_001)] {
        if let Some(cs) = cs {
            c.set_chunk_size(cs).unwrap();
        }
        let data = pattern(len, len as u64);
        let fd = c.create("/big", O_RDWR | O_TRUNC, 0o644).unwrap();
        assert_eq!(c.pwrite(fd, &data, 0).unwrap(), len);
        let mut back = vec![0u8; len + 1000];
        assert_eq!(c.pread(fd, &mut back, 0).unwrap(), len);
        assert!(back[..len] == data[..], "chunk size {cs:?}");
        // Unaligned reads across chunk boundaries.
        assert_eq!(c.pread(fd, &mut back[..70_000], 12_345).unwrap(), 70_000);
        assert!(back[..70_000] == data[12_345..82_345]);
        c.close(fd).unwrap();
        assert_eq!(c.stat("/big").unwrap().size, len as u64);
        // Another client (its own sessions) reads it too.
        let c2 = fabric_client(&p);
        let fd = c2.open("/big", O_RDONLY, 0).unwrap();
        let mut again = vec![0u8; len];
        assert_eq!(c2.pread(fd, &mut again, 0).unwrap(), len);
        assert!(again == data);
        c2.close(fd).unwrap();
        c.unlink("/big").unwrap();
    }
    // Status of every server, over the fabric.
    for (addr, st) in c.server_status() {
        assert!(st.is_ok(), "{addr}: {st:?}");
    }
}

/// Chunk data of at least CHFS_RDMA_THRESH moves by the server's RMA:
/// chunks larger than a fabric message (1 MiB, 4 MiB) work only so, and
/// the bytes are right on both sides of the threshold, for reads and
/// writes, aligned or not.
#[test]
fn chunks_from_the_rdma_threshold_move_by_rma() {
    let Some(p) = fabric_pool(2, "chunks_from_the_rdma_threshold_move_by_rma") else {
        return;
    };
    // (1 MiB: above a message, so that smaller chunk data that does
    // not fit one moves by RMA too.)
    for thresh in [32 * 1024, 4096, 1 << 20] {
        let c = client(&p, |c| {
            c.secret = p.secret().unwrap().as_bytes().to_vec();
            c.rdma_thresh = thresh;
        });
        // (69,000 and 69,600: a chunk just inside and just past a message.)
        for cs in [1 << 20, 4 << 20, 65_536, 40_000, 69_000, 69_600] {
            c.set_chunk_size(cs).unwrap();
            let path = format!("/rma-{thresh}-{cs}");
            let len = 3 * cs as usize + 12_345;
            let data = pattern(len, cs as u64 + thresh as u64);
            let fd = c.create(&path, O_RDWR, 0o644).unwrap();
            assert_eq!(c.pwrite(fd, &data, 0).unwrap(), len, "chunk size {cs}");
            let mut back = vec![0u8; len + 7];
            assert_eq!(c.pread(fd, &mut back, 0).unwrap(), len);
            assert!(
                back[..len] == data[..],
                "chunk size {cs}, threshold {thresh}"
            );
            // Around the threshold: pieces one byte below, at and above
            // it, written and read back at an odd offset.
            for n in [thresh - 1, thresh, thresh + 1] {
                let off = 777u64;
                let piece = pattern(n, n as u64);
                assert_eq!(c.pwrite(fd, &piece, off).unwrap(), n);
                let mut got = vec![0u8; n];
                assert_eq!(c.pread(fd, &mut got, off).unwrap(), n);
                assert!(got == piece, "{n} bytes, chunk size {cs}");
            }
            c.close(fd).unwrap();
            c.unlink(&path).unwrap();
        }
    }
}

#[test]
fn a_wrong_secret_is_refused_over_ofi_tcp() {
    let Some(p) = fabric_pool(1, "a_wrong_secret_is_refused_over_ofi_tcp") else {
        return;
    };
    let cfg = |secret: &[u8]| chfs_client::ClientConfig {
        servers: vec![p.addrs()[0].clone()],
        secret: secret.to_vec(),
        rpc_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let e = chfs_client::Client::connect(cfg(b"not-the-pool-secret"))
        .err()
        .expect("refused");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    let e = chfs_client::Client::connect(cfg(b""))
        .err()
        .expect("refused");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    // The right one is let in afterwards (the refused sessions left nothing
    // broken behind).
    let c = chfs_client::Client::connect(cfg(p.secret().unwrap().as_bytes())).unwrap();
    c.mkdir("/ok", 0o755).unwrap();
}

#[test]
fn a_dead_server_gives_an_errno_not_a_hang() {
    let Some(mut p) = fabric_pool(2, "a_dead_server_gives_an_errno_not_a_hang") else {
        return;
    };
    let c = killing_client(&p);
    let data = pattern(2 << 20, 9);
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    p.kill(1);
    let t = Instant::now();
    let mut back = vec![0u8; data.len()];
    let e = c.pread(fd, &mut back, 0).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        [
            libc::EIO,
            libc::ETIMEDOUT,
            libc::ENOTCONN,
            libc::ECONNRESET,
            libc::ECONNREFUSED,
            libc::EHOSTUNREACH
        ]
        .contains(&e.errno()),
        "{e}"
    );
    // The link is given up; the next request finds nothing listening at
    // once (ECONNREFUSED, as over TCP), not after another timeout.
    let t = Instant::now();
    let e = c.pread(fd, &mut back, 0).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    // EACCES when, in the meantime, a server of another pool (another test
    // running in parallel) took the port: it refuses this pool's secret.
    // Seen once in 7 full runs.
    assert!(
        [libc::ECONNREFUSED, libc::EACCES].contains(&e.errno()),
        "{e}"
    );
}

/// A server killed in the middle of a large write: the write fails with an
/// errno within about the request timeout, and the client goes on with the
/// servers that are left.
#[test]
fn a_server_killed_mid_transfer_gives_an_errno() {
    let Some(mut p) = fabric_pool(2, "a_server_killed_mid_transfer_gives_an_errno") else {
        return;
    };
    let c = killing_client(&p);
    c.set_chunk_size(1 << 20).unwrap();
    let data = pattern(256 << 20, 3);
    let fd = c.create("/big", O_RDWR, 0o644).unwrap();
    let t = Instant::now();
    let r = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut done = 0;
            // Until it fails (the server dies while some are in flight).
            for _ in 0..40 {
                c.pwrite(fd, &data, 0)?;
                done += 1;
            }
            Ok::<_, chfs_client::Error>(done)
        });
        std::thread::sleep(Duration::from_millis(300));
        p.kill(1);
        w.join().unwrap()
    });
    failed_in_time(r.expect_err("writes to a killed server fail"), t);
    server_0_serves(&c);
}

/// A client of `p` (with its secret) for tests that kill one of its
/// servers: calls time out after 3 s.
fn killing_client(p: &LocalPool) -> chfs_client::Client {
    client(p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_secs(3);
    })
}

/// The error of calls to a server killed under them: an errno of a dead
/// peer, within a few RPC timeouts (3 s) of `since`, not a hang.
fn failed_in_time(e: chfs_client::Error, since: Instant) {
    assert!(
        since.elapsed() < Duration::from_secs(15),
        "took {:?}",
        since.elapsed()
    );
    assert!(
        [
            libc::EIO,
            libc::ETIMEDOUT,
            libc::ENOTCONN,
            libc::ECONNRESET,
            libc::ECONNREFUSED,
            libc::ECANCELED
        ]
        .contains(&e.errno()),
        "{e}"
    );
}

/// The pool's first server (the one left) still serves `c`: a file it
/// owns is created and written.
fn server_0_serves(c: &chfs_client::Client) {
    let name = (0..100)
        .map(|i| format!("/alive{i}"))
        .find(|n| c.entry_servers(n).is_ok_and(|(owner, _)| owner == 0))
        .expect("a name owned by server 0");
    let fd = c.create(&name, O_WRONLY, 0o644).unwrap();
    c.write(fd, b"still here").unwrap();
    c.close(fd).unwrap();
}

/// A server restarted on the same fabric address: the client's broken
/// link is dropped, the peer inserted into the address vector again and
/// a new session opened on the next request.
#[test]
fn a_restarted_server_gets_a_new_session() {
    let Some(mut p) = fabric_pool(2, "a_restarted_server_gets_a_new_session") else {
        return;
    };
    let c = killing_client(&p);
    let before = p.addrs().to_vec();
    let name = (0..100)
        .map(|i| format!("/r{i}"))
        .find(|n| c.entry_servers(n).is_ok_and(|(owner, _)| owner == 1))
        .expect("a name owned by server 1");
    let fd = c.create(&name, O_WRONLY, 0o644).unwrap();
    c.write(fd, b"one").unwrap();
    c.close(fd).unwrap();
    p.restart(1).unwrap();
    assert_eq!(p.addrs(), &before[..], "restarted on the same address");
    // The first request may meet the broken link; within a few the client
    // is back (the DRAM store starts empty: the entry is gone).
    let mut ok = false;
    for _ in 0..20 {
        match c.create(&name, O_WRONLY, 0o644) {
            Ok(fd) => {
                c.write(fd, b"two").unwrap();
                c.close(fd).unwrap();
                ok = true;
                break;
            }
            Err(e) => assert_ne!(e.errno(), libc::EEXIST, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "no new session with the restarted server");
    let fd = c.open(&name, O_RDONLY, 0).unwrap();
    let mut b = [0u8; 8];
    assert_eq!(c.read(fd, &mut b).unwrap(), 3);
    assert_eq!(&b[..3], b"two");
}

/// A pool of a TCP server and a fabric one: the client reaches each over
/// its own transport, and the servers forward to each other (renames,
/// membership) whatever the other speaks.
#[test]
fn a_pool_mixing_tcp_and_ofi_tcp() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_pool_mixing_tcp_and_ofi_tcp",
            "built without libfabric",
        );
        return;
    }
    let p = LocalPool::start(1).expect("tcp server");
    // A second server on the fabric joins it (started and stopped here, by
    // its PID).
    let info = std::env::temp_dir().join(format!("chfs-mixed-{}.addr", std::process::id()));
    let _ = std::fs::remove_file(&info);
    let mut child = std::process::Command::new(chfs_localpool::find_chfsd().unwrap())
        .args([
            "--host",
            "127.0.0.1:0",
            "-p",
            "ofi+tcp",
            "--log-level",
            "warn",
            "-j",
        ])
        .arg(&p.addrs()[0])
        .arg("-S")
        .arg(&info)
        .env_remove("CHFS_SECRET")
        .env_remove("CHFS_SECRET_FILE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(&info).is_ok_and(|s| s.ends_with('\n')) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "fabric server did not start"
        );
        assert!(child.try_wait().unwrap().is_none(), "fabric server exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _guard = Killed(child);
    let _ = std::fs::remove_file(&info);
    let c = client(&p, |_| {});
    let servers = c.servers();
    assert_eq!(servers.len(), 2);
    assert!(
        !servers[0].contains("://") && servers[1].starts_with("ofi+tcp://"),
        "{servers:?}"
    );
    // Files on both, entries renamed across them (a move between servers).
    c.set_chunk_size(4096).unwrap();
    let data = pattern(200_000, 4);
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..16 {
        let name = format!("/m{i}");
        owners.insert(c.entry_servers(&name).unwrap().0);
        let fd = c.create(&name, O_RDWR, 0o644).unwrap();
        c.pwrite(fd, &data, 0).unwrap();
        c.close(fd).unwrap();
        c.rename(&name, &format!("/n{i}")).unwrap();
        let fd = c.open(&format!("/n{i}"), O_RDONLY, 0).unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
        assert!(back == data, "/n{i}");
        c.close(fd).unwrap();
    }
    assert_eq!(owners.len(), 2, "entries on both servers");
    assert_eq!(c.readdir("/").unwrap().len(), 16);
    for (addr, st) in c.server_status() {
        assert!(st.is_ok(), "{addr}: {st:?}");
    }
}

/// A listing larger than a fabric message comes in pages that fit (the
/// client's page of 4096 entries would be ~300 KiB).
#[test]
fn a_large_directory_lists_over_ofi_tcp() {
    let Some(p) = fabric_pool(1, "a_large_directory_lists_over_ofi_tcp") else {
        return;
    };
    let c = fabric_client(&p);
    c.mkdir("/big", 0o755).unwrap();
    let n = 3000;
    for i in 0..n {
        let fd = c
            .create(
                &format!("/big/a-rather-long-file-name-{i:06}"),
                O_WRONLY,
                0o644,
            )
            .unwrap();
        c.close(fd).unwrap();
    }
    let names: std::collections::BTreeSet<String> = c
        .readdir("/big")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), n);
    assert!(names.contains("a-rather-long-file-name-002999"));
    // A tree listing (find's one request per server) is cut to pages
    // that fit as well, with and without the headers.
    for with_meta in [false, true] {
        let t = c
            .list_tree("/", with_meta)
            .unwrap()
            .expect("the server lists trees");
        assert_eq!(t.len(), n + 1, "with_meta {with_meta}");
        assert_eq!(t.path(0), "/big");
        assert_eq!(t.path(n), "/big/a-rather-long-file-name-002999");
        assert_eq!(t.meta(n).is_some(), with_meta);
    }
}

/// What a broken or hostile peer can send chfsd's fabric endpoint: bytes
/// that are no frame, frames of no session, malformed hellos, a hello
/// with another message size (refused, EPROTO), requests with a missing or
/// bogus RMA key (answered with an error): the server answers or drops
/// each and goes on serving.
#[test]
fn bad_input_over_ofi_tcp() {
    use chfs_fabric::rpc::{encode_hello, encode_message, RpcClient, FLAG_RMA, OP_AUTH_HELLO};
    use chfs_fabric::{Config, Endpoint, Protocol, RemoteKey};
    use chfs_proto::handshake::{Credential, Role};
    let Some(p) = fabric_pool(1, "bad_input_over_ofi_tcp") else {
        return;
    };
    let server: chfs_fabric::Address = p.addrs()[0].parse().unwrap();
    let t = Duration::from_secs(5);
    let mut cfg = Config::new(Protocol::Tcp).bind("127.0.0.1", None);
    cfg.max_message = 64 * 1024 + 4096;
    let rpc = RpcClient::new(std::sync::Arc::new(Endpoint::open(&cfg).unwrap()));
    let ep = rpc.endpoint().clone();
    let peer = ep.connect(&server).unwrap();
    // No frame; a frame of a session that does not exist; hellos cut short.
    ep.send(peer, b"garbage", t).unwrap();
    ep.send(peer, &encode_message(12345, 1, 3, 0, b"x"), t)
        .unwrap();
    ep.send(peer, &encode_message(0, 2, OP_AUTH_HELLO, 0, &[9, 0, 1]), t)
        .unwrap();
    let hello = encode_hello("ofi+tcp://127.0.0.1:1", 1, &[0u8; 10]);
    ep.send(peer, &encode_message(0, 3, OP_AUTH_HELLO, 0, &hello), t)
        .unwrap();
    // A hello with another largest message: refused with EPROTO.
    let mut other = cfg.clone();
    other.max_message = 4096;
    let small = RpcClient::new(std::sync::Arc::new(Endpoint::open(&other).unwrap()));
    let cred = Credential::parse(p.secret().unwrap().as_bytes()).unwrap();
    let e = small
        .handshake(&server, Role::Client, &cred, t)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EPROTO, "{e}");
    // A proper session; then a write whose RMA key is cut short, and one
    // whose key names memory nobody registered.
    let s = rpc.handshake(&server, Role::Client, &cred, t).unwrap();
    let write = chfs_proto::Request::Write {
        path: "/x".into(),
        fileid: 1,
        chunk_size: 1 << 20,
        mode: 0o644,
        idx: 0,
        off: 0,
        flags: 0,
        epoch: 0,
        data: bytes::Bytes::new(),
    };
    let mut head = Vec::new();
    write.encode(&mut head);
    let mut cut = head.clone();
    cut.extend_from_slice(&[1, 2, 3]);
    let bogus = RemoteKey {
        addr: 0x1000,
        len: 1 << 20,
        key: 0xdead,
    };
    let mut forged = head.clone();
    forged.extend_from_slice(&bogus.encode());
    let id = rpc.post(&s, write.op(), FLAG_RMA, &cut, t).unwrap();
    let (h, _) = rpc.wait(&s, id, t).unwrap();
    assert_ne!(
        h.flags & chfs_proto::frame::FLAG_ERROR,
        0,
        "answered with an error"
    );
    // Lent frames (`FLAG_LENT`) that are not: a payload that is no key,
    // and a key of more than a frame may hold: errors, nothing pulled.
    use chfs_fabric::rpc::{encode_message_from, FLAG_LENT};
    let from = ep.address().to_string();
    let huge = RemoteKey {
        addr: 0x1000,
        len: u64::from(chfs_proto::frame::MAX_PAYLOAD) + 1,
        key: 0xdead,
    };
    for (id, body) in [(900u64, &b"not a key"[..]), (901, &huge.encode()[..])] {
        let m = encode_message_from(s.token, id, write.op(), FLAG_LENT, body, from.as_bytes());
        ep.send(s.peer, &m, t).unwrap();
        let (h, payload) = rpc.wait(&s, id, t).unwrap();
        assert_ne!(h.flags & chfs_proto::frame::FLAG_ERROR, 0, "frame {id}");
        let e = chfs_proto::msg::decode_error(payload).unwrap();
        assert_eq!(e.errno, libc::EPROTO, "frame {id}: {}", e.message);
    }
    // A read asked for in the message beyond what a message holds: refused
    // (EMSGSIZE), not lent (chunk data moves by the client's RMA).
    let c0 = fabric_client(&p);
    c0.set_chunk_size(1 << 20).unwrap();
    let fd = c0.create("/inline", O_WRONLY, 0o644).unwrap();
    c0.write(fd, &pattern(200_000, 5)).unwrap();
    c0.close(fd).unwrap();
    let mut b = Vec::new();
    chfs_proto::Request::Stat {
        path: "/inline".into(),
    }
    .encode(&mut b);
    let id = rpc.post(&s, chfs_proto::msg::op::STAT, 0, &b, t).unwrap();
    let (_, payload) = rpc.wait(&s, id, t).unwrap();
    let Ok(chfs_proto::Response::Meta(meta)) = chfs_proto::Response::decode(payload) else {
        panic!("no entry");
    };
    let read = chfs_proto::Request::Read {
        path: "/inline".into(),
        fileid: meta.fileid,
        idx: 0,
        off: 0,
        len: 200_000,
        chunk_size: 1 << 20,
        flags: 0,
        epoch: meta.epoch(),
    };
    let mut b = Vec::new();
    read.encode(&mut b);
    let id = rpc.post(&s, read.op(), 0, &b, t).unwrap();
    let (h, payload) = rpc.wait(&s, id, t).unwrap();
    assert_ne!(h.flags & chfs_proto::frame::FLAG_ERROR, 0, "{h:?}");
    let e = chfs_proto::msg::decode_error(payload).unwrap();
    assert_eq!(e.errno, libc::EMSGSIZE, "{}", e.message);
    // The forged key: the server's RMA fails (tcp checks keys) and that
    // breaks the rxm connection between the two endpoints for good
    // (doc/fabric.md), so its error reply may be lost: an error or a
    // timeout (here: the timeout).
    let id = rpc.post(&s, write.op(), FLAG_RMA, &forged, t).unwrap();
    if let Ok((h, _)) = rpc.wait(&s, id, t) {
        assert_ne!(
            h.flags & chfs_proto::frame::FLAG_ERROR,
            0,
            "answered with an error"
        );
    }
    // The server still serves, over the fabric, the real client.
    let c = fabric_client(&p);
    c.mkdir("/after", 0o755).unwrap();
    assert!(c.stat("/after").unwrap().is_dir());
}

/// A client that goes away ends its sessions: the server forgets them
/// (it said so in its debug log) instead of keeping one per client process
/// it ever served.
#[test]
fn a_client_that_goes_away_ends_its_sessions() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_client_that_goes_away_ends_its_sessions",
            "built without libfabric",
        );
        return;
    }
    let p = LocalPool::start_with(PoolOptions {
        servers: 1,
        args: vec!["-p".into(), "ofi+tcp".into()],
        log_level: "chfs_server::fabric=debug,warn".into(),
        ..Default::default()
    })
    .expect("start chfsd");
    let log = p.log_dir().join("server0.log");
    let closed = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("fabric session closed")
            .count()
    };
    let c = client(&p, |_| {});
    c.mkdir("/d", 0o755).unwrap();
    // (the session that fetched the server list at connect may be over)
    std::thread::sleep(Duration::from_millis(200));
    let before = closed();
    drop(c);
    let t = Instant::now();
    while closed() == before {
        assert!(t.elapsed() < Duration::from_secs(5), "no session closed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process this test started, killed (by its pid) and waited
/// for when dropped, however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Counts `what` in server 0's log.
fn log_count(p: &LocalPool, what: &str) -> usize {
    std::fs::read_to_string(p.log_dir().join("server0.log"))
        .unwrap_or_default()
        .matches(what)
        .count()
}

/// One fabric server whose sessions expire after 2 s idle, its fabric
/// debug log on.
fn expiring_pool(test: &str) -> Option<LocalPool> {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric");
        return None;
    }
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 1,
            args: vec![
                "-p".into(),
                "ofi+tcp".into(),
                "--idle-timeout".into(),
                "2".into(),
            ],
            log_level: "chfs_server::fabric=debug,warn".into(),
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd");
    Some(p)
}

/// Run by `a_client_killed_leaves_no_session_behind` in a child process
/// (this test binary again): connects to the server it is given, makes a
/// request, says so and waits to be killed.
#[test]
fn fabric_child_client() {
    let (Ok(server), Ok(secret)) = (
        std::env::var("CHFS_TEST_CHILD_SERVER"),
        std::env::var("CHFS_TEST_CHILD_SECRET"),
    ) else {
        return;
    };
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: vec![server],
        secret: secret.into_bytes(),
        rpc_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .unwrap();
    c.mkdir("/child", 0o755).unwrap();
    println!("CHILD READY");
    std::thread::sleep(Duration::from_secs(120));
}

/// A client killed with SIGKILL (no OP_BYE) leaves no session and no
/// address-vector entry behind: both go after the idle timeout. A client
/// that was merely idle for as long gets a new session at its next
/// request, at once (the server answers the forgotten token with
/// OP_NO_SESSION), not after its RPC timeout.
#[test]
fn a_killed_client_leaves_no_session_behind() {
    let Some(p) = expiring_pool("a_killed_client_leaves_no_session_behind") else {
        return;
    };
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_secs(10);
    });
    c.mkdir("/d", 0o755).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fabric_child_client", "--nocapture"])
        .env("CHFS_TEST_CHILD_SERVER", &p.addrs()[0])
        .env("CHFS_TEST_CHILD_SECRET", p.secret().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let ready = out
            .lines()
            .map_while(|l| l.ok())
            .any(|l| l.contains("CHILD READY"));
        assert!(ready, "the child client did not start");
    }
    assert!(c.stat("/child").unwrap().is_dir());
    // SIGKILL: no goodbye.
    child.kill().unwrap();
    child.wait().unwrap();
    // Both endpoints (the killed client's, this idle one's) lose their
    // sessions and leave the address vector.
    let t = Instant::now();
    while log_count(&p, "fabric peer removed") < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "sessions expired: {}, peers removed: {}",
            log_count(&p, "fabric session expired"),
            log_count(&p, "fabric peer removed")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(log_count(&p, "fabric session expired") >= 2);
    // ... and status counts them.
    let st = c.server_status().pop().unwrap().1.unwrap();
    assert!(st.fabric_expired >= 2, "{st:?}");
    // The idle client's next request works, well within its timeout.
    let t = Instant::now();
    assert!(c.stat("/d").unwrap().is_dir());
    let fd = c.create("/d/f", O_RDWR, 0o644).unwrap();
    let data = pattern(3 << 20, 5);
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    let mut back = vec![0u8; data.len()];
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    assert!(back == data);
    c.close(fd).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
}

/// A server restarted at the same address answers the old session's
/// requests OP_NO_SESSION: the client's next request succeeds at once (a
/// new session, the request sent again), well within its timeout; so do
/// eight threads' requests sent at once right after the restart.
#[test]
fn a_restarted_server_is_back_at_the_next_request() {
    let Some(mut p) = expiring_pool("a_restarted_server_is_back_at_the_next_request") else {
        return;
    };
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_secs(10);
    });
    c.mkdir("/before", 0o755).unwrap();
    for round in 0..4 {
        p.restart(0).unwrap();
        if round % 2 == 1 {
            // Eight threads' requests at once are the first after it.
            let t = Instant::now();
            std::thread::scope(|s| {
                for i in 0..8 {
                    let c = &c;
                    s.spawn(move || c.mkdir(&format!("/t{round}-{i}"), 0o755).unwrap());
                }
            });
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "round {round}: {:?}",
                t.elapsed()
            );
        }
        let t = Instant::now();
        c.mkdir(&format!("/after{round}"), 0o755).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "round {round}: took {:?}",
            t.elapsed()
        );
        let t = Instant::now();
        let data = pattern(2 << 20, round);
        let fd = c.create("/f", O_RDWR | O_TRUNC, 0o644).unwrap();
        assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
        c.close(fd).unwrap();
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}

/// Over ofi+tcp, chunk data from CHFS_RDMA_THRESH moves straight from
/// the caller's buffer (writes) and into it (reads), lent for the
/// request: no window, no copy (`ClientStats::rma_lent`), for 1 MiB
/// chunks (one per call) and 64 KiB ones (16 in flight per write; a read
/// of such small chunks goes a request per server into a buffer of the
/// client's, lent too, then copied: `client/byserver.rs`). Buffers
/// are freed and new ones allocated each round (the allocator hands the
/// same addresses back) with other bytes: each write sends the bytes the
/// buffer holds now and each read lands in the buffer given now, never a
/// registration of an earlier one. Before, each went through a window
/// with a copy.
#[test]
fn large_chunks_move_from_and_into_the_callers_memory() {
    let Some(p) = fabric_pool(2, "large_chunks_move_from_and_into_the_callers_memory") else {
        return;
    };
    let c = fabric_client(&p);
    let before = c.stats();
    let mut calls = 0u64;
    for cs in [1u32 << 20, 64 << 10] {
        c.set_chunk_size(cs).unwrap();
        let path = format!("/lent-{cs}");
        let fd = c.create(&path, O_RDWR, 0o644).unwrap();
        let len = 2 << 20;
        let mut seen = std::collections::HashSet::new();
        for round in 0..6u64 {
            let data = pattern(len, round * 7 + cs as u64);
            seen.insert(data.as_ptr() as usize);
            assert_eq!(c.pwrite(fd, &data, 0).unwrap(), len);
            let mut back = vec![0u8; len];
            seen.insert(back.as_ptr() as usize);
            assert_eq!(c.pread(fd, &mut back, 0).unwrap(), len);
            assert!(back == data, "chunk size {cs}, round {round}");
            // The other half of a buffer read again, unaligned, into a
            // part of a reused one.
            back.fill(0);
            assert_eq!(c.pread(fd, &mut back[100..], 12_345).unwrap(), len - 12_345);
            assert!(back[100..100 + len - 12_345] == data[12_345..]);
            calls += if cs > 256 << 10 {
                len as u64 / cs as u64 * 2 + (len as u64 - 12_345).div_ceil(cs as u64)
            } else {
                // Writes and reads of small chunks go a request per
                // server (from and into a buffer of the client's, lent
                // too, with a copy).
                2 + 2
            };
        }
        // (Addresses came back: a stale lending would have shown.)
        assert!(seen.len() < 12, "chunk size {cs}: {} addresses", seen.len());
        c.close(fd).unwrap();
        c.unlink(&path).unwrap();
    }
    let after = c.stats();
    assert_eq!(after.rma_copied, before.rma_copied, "{after:?}");
    assert!(
        after.rma_lent >= before.rma_lent + calls,
        "{after:?}, {calls}"
    );
}

/// `status` counts fabric sessions and the chunk data moved by RMA (and
/// registration fallbacks to copies: none here).
#[test]
fn status_counts_fabric_sessions_and_rma() {
    let Some(p) = fabric_pool(1, "status_counts_fabric_sessions_and_rma") else {
        return;
    };
    let status = |c: &chfs_client::Client| c.server_status().pop().unwrap().1.unwrap();
    let c = fabric_client(&p);
    let before = status(&c);
    assert!(before.fabric_sessions >= 1, "{before:?}");
    let c2 = fabric_client(&p);
    c2.mkdir("/x", 0o755).unwrap();
    assert!(status(&c).fabric_sessions >= 2);
    c.set_chunk_size(1 << 20).unwrap();
    let data = pattern(4 << 20, 3);
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    let mut back = vec![0u8; data.len()];
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    assert!(back == data);
    c.close(fd).unwrap();
    let after = status(&c);
    assert!(after.rma_pulls >= before.rma_pulls + 4, "{after:?}");
    assert!(after.rma_pushes >= before.rma_pushes + 4, "{after:?}");
    assert_eq!(after.reg_fallbacks, 0);
    assert_eq!(after.fabric_expired, 0);
    // The other client's sessions end with it.
    let open = after.fabric_sessions;
    drop(c2);
    let t = Instant::now();
    while status(&c).fabric_sessions >= open {
        assert!(t.elapsed() < Duration::from_secs(5), "no session ended");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Over `ofi+shm`, chunks larger than a message: reads of 1 MiB chunks
/// move by RMA into windows the link owns (shm does not revoke a closed
/// registration, so a window whose request was not answered is never
/// freed: a late write lands in it, not in reused memory).
#[test]
fn one_mib_chunks_over_ofi_shm() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "one_mib_chunks_over_ofi_shm",
            "built without libfabric",
        );
        return;
    }
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            args: vec!["-p".into(), "ofi+shm".into()],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd pool over ofi+shm");
    for a in p.addrs() {
        assert!(a.starts_with("ofi+shm://"), "{a}");
    }
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_secs(10);
    });
    for cs in [1u32 << 20, 65_536] {
        c.set_chunk_size(cs).unwrap();
        let path = format!("/shm-{cs}");
        let len = 4 * cs as usize + 4321;
        let data = pattern(len, cs as u64);
        let fd = c.create(&path, O_RDWR, 0o644).unwrap();
        assert_eq!(c.pwrite(fd, &data, 0).unwrap(), len);
        let mut back = vec![0u8; len + 10];
        assert_eq!(c.pread(fd, &mut back, 0).unwrap(), len, "chunk size {cs}");
        assert!(back[..len] == data[..], "chunk size {cs}");
        let mut part = vec![0u8; (len - 1000).min(300_000)];
        assert_eq!(c.pread(fd, &mut part, 777).unwrap(), part.len());
        assert!(part[..] == data[777..777 + part.len()]);
        c.close(fd).unwrap();
    }
    let st = c.server_status();
    assert!(st.iter().all(|(_, s)| s.is_ok()));
    assert!(
        st.iter()
            .map(|(_, s)| s.as_ref().unwrap().rma_pushes)
            .sum::<u64>()
            >= 8
    );
    // shm does not revoke a closed registration: the caller's memory is
    // never lent, data goes through the link's windows.
    assert_eq!(c.stats().rma_lent, 0);
    assert!(c.stats().rma_copied >= 12, "{:?}", c.stats());
}

/// A request that takes longer than the server's idle timeout (a relayed
/// lookup whose owner hangs for 7 s) is answered, and its session does
/// not expire under it (it did: the client was removed from the address
/// vector before the answer left, which was lost, and the client failed
/// with ETIMEDOUT after its own timeout).
#[test]
fn a_session_with_a_request_in_flight_does_not_expire() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_session_with_a_request_in_flight_does_not_expire",
            "built without libfabric",
        );
        return;
    }
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            args: vec![
                "-p".into(),
                "ofi+tcp".into(),
                "--idle-timeout".into(),
                "2".into(),
                "--rpc-timeout-msec".into(),
                "30000".into(),
            ],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd");
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.lookup = chfs_client::Lookup::RelayGroup(2);
        c.contact_seed = Some(0);
        c.rpc_timeout = Duration::from_secs(25);
    });
    // A path a contact relays (owned by the other server).
    let forwards = |c: &chfs_client::Client| -> Vec<(String, u64)> {
        c.server_status()
            .into_iter()
            .map(|(a, s)| (a, s.expect("status").lookup_forwards))
            .collect()
    };
    let (path, contact) = (0..64)
        .find_map(|i| {
            let path = format!("/relayed{i}");
            let before = forwards(&c);
            let _ = c.stat(&path);
            let after = forwards(&c);
            let k = (0..2).find(|&k| after[k].1 > before[k].1)?;
            Some((path, after[k].0.clone()))
        })
        .expect("a path relayed by a contact");
    let owner = 1 - p.addrs().iter().position(|s| *s == contact).unwrap();
    // (made by another client: this one's lookups of a path it changed
    // skip the contact for a while)
    let other = fabric_client(&p);
    let fd = other.create(&path, O_WRONLY, 0o644).unwrap();
    other.close(fd).unwrap();
    p.signal(owner, libc::SIGSTOP).unwrap();
    let pid = p.pid(owner).unwrap();
    let t = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
    {
        assert!(t.elapsed() < Duration::from_secs(5), "server not stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The owner resumes after the contact has swept the session (2 s
    // idle) and the peer (2 s later) more than once.
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(7));
        // SAFETY: a signal to the server this test started.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    });
    let t = Instant::now();
    let r = c.stat(&path);
    let waited = t.elapsed();
    resume.join().unwrap();
    r.unwrap_or_else(|e| panic!("{e} after {waited:?}"));
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    // Nor did its session expire meanwhile.
    let expired = c
        .server_status()
        .into_iter()
        .find(|(a, _)| *a == contact)
        .map(|(_, s)| s.expect("status").fabric_expired);
    assert_eq!(expired, Some(0));
}

/// Servers on different hosts forward to each other over the fabric
/// (`--test-peers-remote` makes peers on this host take that path too):
/// chunks larger than a message move by RMA, as a client's do — a
/// rebalance's moved 1 MiB chunks (`AdoptChunk`), and 1 MiB and 200 KiB
/// writes and reads forwarded by a server that does not own them (asked by
/// a client that knows only that server).
#[test]
fn large_chunks_forwarded_between_fabric_hosts_move_by_rma() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "large_chunks_forwarded_between_fabric_hosts_move_by_rma",
            "built without libfabric",
        );
        return;
    }
    let mut p = LocalPool::start_with(
        PoolOptions {
            servers: 1,
            args: vec!["-p".into(), "ofi+tcp".into(), "--test-peers-remote".into()],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd over ofi+tcp");
    let c = fabric_client(&p);
    c.set_chunk_size(1 << 20).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..12u64)
        .map(|i| {
            let len = if i % 2 == 0 {
                (3 << 20) + 100
            } else {
                200 << 10
            };
            (format!("/before{i}"), pattern(len, 100 + i))
        })
        .collect();
    let write_all = |c: &chfs_client::Client, files: &[(String, Vec<u8>)]| {
        for (path, data) in files {
            let fd = c.create(path, O_RDWR, 0o644).unwrap();
            assert_eq!(c.pwrite(fd, data, 0).unwrap(), data.len(), "{path}");
            c.close(fd).unwrap();
        }
    };
    let check_all = |c: &chfs_client::Client, files: &[(String, Vec<u8>)]| {
        for (path, data) in files {
            let fd = c.open(path, O_RDONLY, 0).unwrap();
            let mut back = vec![0u8; data.len() + 10];
            assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len(), "{path}");
            assert!(back[..data.len()] == data[..], "{path}: data differs");
            c.close(fd).unwrap();
        }
    };
    write_all(&c, &files);
    // (its list of servers, of one, is kept until it is told of another)
    let one = client(&p, |cfg| {
        cfg.secret = p.secret().unwrap().as_bytes().to_vec();
        cfg.node_list_cache_timeout = Duration::from_secs(3600);
    });
    one.set_chunk_size(1 << 20).unwrap();
    p.add_server().unwrap();
    let c2 = client(&p, |cfg| {
        cfg.secret = p.secret().unwrap().as_bytes().to_vec();
        cfg.role = chfs_proto::handshake::Role::Admin;
    });
    c2.set_chunk_size(1 << 20).unwrap();
    assert_eq!(c2.servers().len(), 2);
    // The rebalance moves chunks to the new server by AdoptChunk.
    let r = c2.rebalance().unwrap();
    assert!(r.moved > 0 && r.failed == 0, "{r:?}");
    check_all(&c2, &files);
    // A client that knows only the first server (`one`): what the second
    // owns is forwarded to it, both ways.
    let forwarded = |c: &chfs_client::Client| -> u64 {
        c.server_status()
            .into_iter()
            .map(|(_, s)| s.expect("status").forwarded)
            .sum()
    };
    let before = forwarded(&c2);
    let after_files: Vec<(String, Vec<u8>)> = (0..12u64)
        .map(|i| {
            let len = if i % 2 == 0 {
                (1 << 20) + (1 << 20)
            } else {
                200 << 10
            };
            (format!("/after{i}"), pattern(len, 200 + i))
        })
        .collect();
    write_all(&one, &after_files);
    check_all(&one, &after_files);
    check_all(&one, &files);
    assert!(
        forwarded(&c2) >= before + 6,
        "{} forwarded: the test proves nothing",
        forwarded(&c2) - before
    );
    check_all(&c2, &after_files);
    // Renames move chunks to the new name's owners (PutChunk).
    let moved: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(path, data)| {
            let to = path.replace("/before", "/renamed");
            c2.rename(path, &to).unwrap();
            (to, data.clone())
        })
        .collect();
    check_all(&c2, &moved);
}

/// A server forwards chunk data to a peer on another host by RMA from its
/// own RDMA threshold on (chfsd `--rdma-thresh`, `CHFS_RDMA_THRESH`), in
/// the message below it, as a client does with its CHFS_RDMA_THRESH
/// (before: a built-in 32 KiB, whatever chfsd was told). A client that
/// knows only the first server writes and reads files of 16 KiB chunks
/// with the servers' threshold at 4 KiB (what the second server owns goes
/// by RMA: it pulls the writes and pushes the reads), and of 48 KiB chunks
/// with it at 64 KiB (in messages: the second server moves nothing by
/// RMA); the data is checked, and the forwards counted.
#[test]
fn forwards_between_fabric_hosts_follow_the_servers_rdma_threshold() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "forwards_between_fabric_hosts_follow_the_servers_rdma_threshold",
            "built without libfabric",
        );
        return;
    }
    for (thresh, chunk, by_rma) in [("4096", 16usize << 10, true), ("65536", 48 << 10, false)] {
        let mut p = LocalPool::start_with(
            PoolOptions {
                servers: 1,
                args: vec![
                    "-p".into(),
                    "ofi+tcp".into(),
                    "--test-peers-remote".into(),
                    "--rdma-thresh".into(),
                    thresh.into(),
                ],
                ..Default::default()
            }
            .with_new_secret(),
        )
        .expect("start chfsd over ofi+tcp");
        // (its list of servers, of one, is kept until it is told of another)
        let one = client(&p, |cfg| {
            cfg.secret = p.secret().unwrap().as_bytes().to_vec();
            cfg.node_list_cache_timeout = Duration::from_secs(3600);
        });
        one.set_chunk_size(chunk as u32).unwrap();
        p.add_server().unwrap();
        let second = p.addrs()[1].clone();
        let all = fabric_client(&p);
        assert_eq!(all.servers().len(), 2);
        let status = || {
            let st = all.server_status();
            let of = |a: &str| {
                st.iter()
                    .find(|(x, _)| x == a)
                    .and_then(|(_, s)| s.as_ref().ok())
                    .cloned()
                    .unwrap_or_else(|| panic!("no status of {a}: {st:?}"))
            };
            let s2 = of(&second);
            (of(&p.addrs()[0]).forwarded, s2.rma_pulls, s2.rma_pushes)
        };
        let (fwd0, pulls0, pushes0) = status();
        let files: Vec<(String, Vec<u8>)> = (0..4u64)
            .map(|i| (format!("/t{thresh}-{i}"), pattern(8 * chunk, 300 + i)))
            .collect();
        for (path, data) in &files {
            let fd = one.create(path, O_RDWR, 0o644).unwrap();
            assert_eq!(one.pwrite(fd, data, 0).unwrap(), data.len(), "{path}");
            one.close(fd).unwrap();
        }
        for (path, data) in &files {
            let fd = one.open(path, O_RDONLY, 0).unwrap();
            let mut back = vec![0u8; data.len()];
            assert_eq!(one.pread(fd, &mut back, 0).unwrap(), data.len(), "{path}");
            assert!(back == *data, "{path}: data differs");
            one.close(fd).unwrap();
        }
        let (fwd, pulls, pushes) = status();
        assert!(
            fwd >= fwd0 + 8,
            "--rdma-thresh {thresh}: {} forwarded: the test proves nothing",
            fwd - fwd0
        );
        let (pulled, pushed) = (pulls - pulls0, pushes - pushes0);
        if by_rma {
            assert!(
                pulled >= 4 && pushed >= 4,
                "--rdma-thresh {thresh}, {chunk}-byte chunks: the second server pulled {pulled} \
                 and pushed {pushed} (forwarded {})",
                fwd - fwd0
            );
        } else {
            assert_eq!(
                (pulled, pushed),
                (0, 0),
                "--rdma-thresh {thresh}, {chunk}-byte chunks moved by RMA (forwarded {})",
                fwd - fwd0
            );
        }
    }
}

/// Run by `a_stopped_client_does_not_stall_the_others` in a child process
/// (this test binary again): many threads reading and writing 1 MiB
/// chunks (by RMA) and reading 24 KiB pieces (answered in a message) of
/// the file it is given, as fast as they can, until it is killed.
#[test]
fn fabric_stalling_client() {
    let (Ok(server), Ok(secret)) = (
        std::env::var("CHFS_TEST_STALL_SERVER"),
        std::env::var("CHFS_TEST_STALL_SECRET"),
    ) else {
        return;
    };
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: vec![server],
        secret: secret.into_bytes(),
        rpc_timeout: Duration::from_secs(60),
        ..Default::default()
    })
    .unwrap();
    c.set_chunk_size(1 << 20).unwrap();
    let c = std::sync::Arc::new(c);
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let fd = c.open("/stall/big", O_RDWR, 0).unwrap();
                let mine = c.create(&format!("/stall/w{t}"), O_RDWR, 0o644).unwrap();
                let data = pattern(1 << 20, t);
                let mut buf = vec![0u8; 1 << 20];
                for k in 0u64.. {
                    let off = ((t * 7 + k) % 32) << 20;
                    c.pread(fd, &mut buf, off).unwrap();
                    c.pread(fd, &mut buf[..24 << 10], off + 4096).unwrap();
                    if k % 4 == 0 {
                        c.pwrite(mine, &data, (k % 8) << 20).unwrap();
                    }
                    if t == 0 && k % 2 == 0 {
                        println!("STALLER RUNNING {k}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// A client process stopped (SIGSTOP) with 1 MiB reads and writes by RMA
/// and replies to it pending does not stall the server's other clients:
/// another client's stats and small reads keep being answered within a
/// bound while it stays stopped, and it goes on once resumed (before: the
/// progress thread waited for each reply to the stopped process to leave,
/// up to 10 s, and every other client with it: the other client's stat
/// timed out after 30 s).
#[test]
fn a_stopped_client_does_not_stall_the_others() {
    let Some(p) = fabric_pool(1, "a_stopped_client_does_not_stall_the_others") else {
        return;
    };
    let c = client(&p, |cfg| {
        cfg.secret = p.secret().unwrap().as_bytes().to_vec();
        cfg.rpc_timeout = Duration::from_secs(30);
    });
    c.set_chunk_size(1 << 20).unwrap();
    c.mkdir("/stall", 0o755).unwrap();
    let fd = c.create("/stall/big", O_RDWR, 0o644).unwrap();
    let data = pattern(32 << 20, 9);
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    let small = c.create("/stall/small", O_RDWR, 0o644).unwrap();
    c.pwrite(small, &data[..4096], 0).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fabric_stalling_client", "--nocapture"])
        .env("CHFS_TEST_STALL_SERVER", &p.addrs()[0])
        .env("CHFS_TEST_STALL_SECRET", p.secret().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed (and resumed, to die) whatever happens below.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            // SAFETY: a signal to the child this test started, by its PID.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().unwrap();
    let child = Reap(child);
    // Its progress reports, as they come.
    let (tx, said) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for l in std::io::BufReader::new(out).lines().map_while(|l| l.ok()) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let goes_on = |what: &str| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if said
                .recv_timeout(Duration::from_millis(100))
                .is_ok_and(|l| l.contains("STALLER RUNNING"))
            {
                return;
            }
        }
        panic!("the stalling client does not go on {what}");
    };
    goes_on("at first");
    let mut worst = Duration::ZERO;
    let mut buf = [0u8; 4096];
    for round in 0..3 {
        // Stopped in the middle of its transfers; the others are timed
        // for longer than the server's send timeout (10 s).
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: a signal to the child this test started, by its PID.
        unsafe { libc::kill(child.0.id() as i32, libc::SIGSTOP) };
        let t = Instant::now();
        let mut n = 0;
        while t.elapsed() < Duration::from_secs(if round == 0 { 12 } else { 3 }) {
            let op = Instant::now();
            assert!(c.stat("/stall/small").unwrap().size == 4096);
            assert_eq!(c.pread(small, &mut buf, 0).unwrap(), 4096);
            worst = worst.max(op.elapsed());
            n += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("round {round}: {n} stat+read pairs, the slowest so far {worst:?}");
        // SAFETY: as above.
        unsafe { libc::kill(child.0.id() as i32, libc::SIGCONT) };
        // What it was told before it stopped is still there for it.
        while said.try_recv().is_ok() {}
        goes_on("after it resumed");
    }
    assert!(
        worst < Duration::from_secs(2),
        "another client was stalled for {worst:?} by a stopped one"
    );
    drop(child);
    // The server still serves everyone.
    assert!(c.stat("/stall/big").unwrap().size == 32 << 20);
}

/// A call as a server of the pool (the pool secret) over the fabric, with
/// the transport's own RPC client: what one chfsd sends another.
fn server_call(
    rpc: &chfs_fabric::rpc::RpcClient,
    p: &LocalPool,
    addr: &str,
    req: &chfs_proto::Request,
) -> Result<chfs_proto::Response, String> {
    use chfs_proto::handshake::{Credential, Role};
    let timeout = Duration::from_secs(10);
    let cred = Credential::parse(p.secret().unwrap().as_bytes()).unwrap();
    let a: chfs_fabric::Address = addr.parse().unwrap();
    let s = rpc
        .handshake(&a, Role::Server, &cred, timeout)
        .map_err(|e| format!("handshake with {addr}: {e}"))?;
    let mut payload = Vec::new();
    req.encode(&mut payload);
    let id = rpc
        .post(&s, req.op(), 0, &payload, timeout)
        .map_err(|e| format!("{addr}: post: {e} (errno {})", e.errno()))?;
    let (h, payload) = rpc
        .wait(&s, id, timeout)
        .map_err(|e| format!("{addr}: wait: {e} (errno {})", e.errno()))?;
    if h.flags & chfs_proto::frame::FLAG_ERROR != 0 {
        let e = chfs_proto::msg::decode_error(payload).unwrap();
        return Err(format!("{addr}: errno {}: {}", e.errno, e.message));
    }
    chfs_proto::Response::decode(payload).map_err(|e| format!("{addr}: {e}"))
}

/// Server lists of thousands of fabric addresses (more than one fabric
/// message holds: ~1,900 `ofi+tcp` addresses) move over the fabric: an
/// `UpdateServers` of 5,000 servers (2 real, the rest addresses where
/// nothing listens) sent to each server, `GetServers` of a new client
/// (its list is that of the pool), a server that joins (`Join` and its
/// answer between servers over the fabric: `--test-peers-remote`) and the
/// list the leader then pushes to the other member. Before, each failed
/// with EINVAL or EMSGSIZE ("a message of N bytes; at most 69632").
#[test]
fn server_lists_of_thousands_move_over_the_fabric() {
    use chfs_proto::{Request, Response};
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "server_lists_of_thousands_move_over_the_fabric",
            "built without libfabric",
        );
        return;
    }
    let mut p = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            args: vec![
                "-p".into(),
                "ofi+tcp".into(),
                "--test-peers-remote".into(),
                "--rpc-timeout-msec".into(),
                "10000".into(),
            ],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd over ofi+tcp");
    let cfg = chfs_fabric::Config::new(chfs_fabric::Protocol::Tcp).bind("127.0.0.1", None);
    let ep = chfs_fabric::Endpoint::open(&cfg).expect("an ofi+tcp endpoint");
    let rpc = chfs_fabric::rpc::RpcClient::new(std::sync::Arc::new(ep));
    let real = p.addrs().to_vec();
    let mut list = match server_call(&rpc, &p, &real[0], &Request::GetServers) {
        Ok(Response::Servers(l)) => l,
        other => panic!("{other:?}"),
    };
    assert_eq!(list.servers, real);
    // Addresses in 127.1/16 at port 1: nothing listens there, so pushes
    // and calls to them are refused at once.
    list.servers
        .extend((0..4998).map(|i| format!("ofi+tcp://127.1.{}.{}:1", i / 250, i % 250 + 1)));
    list.version += 1;
    let mut encoded = Vec::new();
    Request::UpdateServers { list: list.clone() }.encode(&mut encoded);
    assert!(encoded.len() > 2 * (64 << 10), "{} bytes", encoded.len());
    for a in &real {
        let r = server_call(&rpc, &p, a, &Request::UpdateServers { list: list.clone() });
        assert_eq!(r, Ok(Response::Ok), "UpdateServers of 5,000 to {a}");
    }
    // A new client fetches the list from its server over the fabric.
    let c = fabric_client(&p);
    assert_eq!(c.servers(), list.servers);
    // The real servers still serve it (the fake ones refuse at once).
    let on_real: Vec<String> = (0..50_000)
        .map(|i| format!("/f{i}"))
        .filter(|f| c.entry_servers(f).unwrap().0 < 2)
        .take(3)
        .collect();
    for f in &on_real {
        let fd = c.create(f, O_WRONLY, 0o644).unwrap();
        c.write(fd, b"hello").unwrap();
        c.close(fd).unwrap();
        assert_eq!(c.stat(f).unwrap().size, 5);
    }
    // A server joins: its Join goes to the leader over the fabric, whose
    // answer is the list of 5,001; the leader pushes it to the others.
    let added = p.add_server().expect("a server joins a pool of 5,000");
    let mut want = list.servers.clone();
    want.push(added.clone());
    let of = |addr: &str| {
        client(&p, |c| {
            c.servers = vec![addr.to_string()];
            c.secret = p.secret().unwrap().as_bytes().to_vec();
        })
        .servers()
    };
    assert_eq!(of(&added), want, "the list the new server got");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = of(&real[1]);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} never got the list of 5,001 ({} servers)",
            real[1],
            got.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(of(&real[0]), want);
}

/// Anyone may send chfsd a message of a session it does not know, naming
/// any address as its sender: chfsd answers `OP_NO_SESSION` there (a
/// send that waits up to 10 s where nobody answers) and keeps the address
/// in its address vector for 2 s. A flood of 3,000 such messages, each
/// naming another address where nothing listens, gets at most ~100
/// answers a second and at most 256 address-vector entries, the rest
/// dropped and counted (`fabric_no_session_dropped`), while a new client
/// is served at once, and chfsd survives: it used to remove a peer from
/// its address vector 2 s after the answer was posted, under a send still
/// in flight (one to an address where nobody answers waits 10 s), and
/// crashed inside the provider (its listener gone: ECONNREFUSED).
#[test]
fn a_flood_of_unknown_sessions_is_bounded() {
    use chfs_fabric::rpc::encode_message_from;
    use chfs_fabric::{Config, Endpoint, Protocol};
    let Some(p) = fabric_pool(1, "a_flood_of_unknown_sessions_is_bounded") else {
        return;
    };
    let server: chfs_fabric::Address = p.addrs()[0].parse().unwrap();
    let ep = Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap();
    let peer = ep.connect(&server).unwrap();
    let mut stat = Vec::new();
    chfs_proto::Request::Stat { path: "/".into() }.encode(&mut stat);
    // The server's bounds (chfsd's fabric.rs): answers per second (as
    // many at once) and strangers held in the address vector.
    const RATE: f64 = 1000.0;
    const STRANGERS: u64 = 256;
    const FLOOD: u64 = 3000;
    let t0 = Instant::now();
    for i in 0..FLOOD {
        let from = format!("ofi+tcp://127.2.{}.{}:1", i / 250, i % 250 + 1);
        let m = encode_message_from(
            0x5eed_0000_0000 + i,
            i + 1,
            chfs_proto::msg::op::STAT,
            0,
            &stat,
            from.as_bytes(),
        );
        ep.send(peer, &m, Duration::from_secs(5)).unwrap();
    }
    let t = Instant::now();
    let c = fabric_client(&p);
    c.mkdir("/served", 0o755).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a new client during the flood took {:?}",
        t.elapsed()
    );
    let status = || c.server_status().pop().unwrap().1.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = status();
    while st.fabric_no_session + st.fabric_no_session_dropped < FLOOD {
        assert!(Instant::now() < deadline, "not all seen: {st:?}");
        std::thread::sleep(Duration::from_millis(100));
        st = status();
    }
    let most = RATE + RATE * t0.elapsed().as_secs_f64() + 5.0;
    assert!(
        (st.fabric_no_session as f64) <= most,
        "{} answered in {:?}: {st:?}",
        st.fabric_no_session,
        t0.elapsed()
    );
    assert!(st.fabric_no_session >= 50, "{st:?}");
    assert!(st.fabric_no_session_dropped >= FLOOD / 2, "{st:?}");
    // The address vector holds at most the bound of strangers (and this
    // client); they leave it 2 s after their answer.
    assert!(st.fabric_peers <= STRANGERS + 2, "{st:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while status().fabric_peers > 2 {
        assert!(Instant::now() < deadline, "{:?}", status());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Still served.
    c.mkdir("/after", 0o755).unwrap();
}

/// Hellos whose proof never comes (a stranger's, or a client's that gave
/// up) end after 10 s, whatever the idle timeout (an hour by default):
/// before, each kept a session and its address-vector entry that long.
#[test]
fn sessions_never_proven_end() {
    use chfs_fabric::rpc::{encode_hello, encode_message, OP_AUTH_HELLO};
    use chfs_fabric::{Config, Endpoint, Protocol};
    use chfs_proto::handshake::{Connector, Credential, Role};
    let Some(p) = fabric_pool(1, "sessions_never_proven_end") else {
        return;
    };
    let server: chfs_fabric::Address = p.addrs()[0].parse().unwrap();
    let ep = Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap();
    let peer = ep.connect(&server).unwrap();
    let cred = Credential::parse(p.secret().unwrap().as_bytes()).unwrap();
    let me = ep.address().to_string();
    for i in 0..50 {
        let (_, hello) = Connector::start(Role::Client, &cred).unwrap();
        let payload = encode_hello(&me, ep.max_message() as u32, &hello);
        let m = encode_message(0, i + 1, OP_AUTH_HELLO, 0, &payload);
        ep.send(peer, &m, Duration::from_secs(5)).unwrap();
    }
    let c = fabric_client(&p);
    let status = || c.server_status().pop().unwrap().1.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status().fabric_sessions < 50 {
        assert!(Instant::now() < deadline, "{:?}", status());
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = status();
        if st.fabric_sessions <= 2 {
            assert!(st.fabric_expired >= 50, "{st:?}");
            break;
        }
        assert!(Instant::now() < deadline, "{st:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    c.mkdir("/still", 0o755).unwrap();
}

/// A server restarted under many clients with open sessions (each its
/// own endpoint, as separate processes are): each client's next message
/// names a session the new server does not know, and each should be told
/// at once (`OP_NO_SESSION`: the client opens a new session and sends
/// again) rather than wait out its RPC timeout (30 s by default) and fail
/// with ETIMEDOUT (a timeout is not sent again by the pool). A bound of
/// 100 such answers a second (`NO_SESSION_PER_SEC`) left 83 of 200
/// clients to time out (found by review of the merges of i21-lists and
/// i21-hosts).
///
/// The clients live in a child process (this test binary again,
/// [`restart_clients_child`]) whose rxm keeps no shared receive context
/// (`FI_OFI_RXM_USE_SRX=0`): with rxm's defaults each endpoint holds
/// ~70 MiB (doc/fabric.md, memory per endpoint), 17.5 GiB for the 200.
#[test]
fn many_clients_of_a_restarted_server_are_told_at_once() {
    use std::io::{BufRead, Write};
    let Some(mut p) = fabric_pool(1, "many_clients_of_a_restarted_server_are_told_at_once") else {
        return;
    };
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "restart_clients_child", "--nocapture"])
        .env("CHFS_TEST_CHILD_SERVER", &p.addrs()[0])
        .env("CHFS_TEST_CHILD_SECRET", p.secret().unwrap())
        .env("FI_OFI_RXM_USE_SRX", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed (by its pid) if this test fails before it ended.
    let mut child = Killed(child);
    let mut out = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut line = |what: &str| {
        out.by_ref()
            .map_while(|l| l.ok())
            .inspect(|l| println!("child: {l}"))
            .find(|l| l.starts_with(what))
            .unwrap_or_else(|| panic!("the child ended before it said {what}"))
    };
    line("CLIENTS READY");
    p.restart(0).unwrap();
    writeln!(child.0.stdin.as_mut().unwrap(), "GO").unwrap();
    let told = line("TOLD");
    // TOLD <told> OF <clients> SLOWEST_MS <ms>
    let f: Vec<u64> = told
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (told, clients_n, slowest) = (f[0], f[1], Duration::from_millis(f[2]));
    let c = client(&p, |c| c.secret = p.secret().unwrap().as_bytes().to_vec());
    let st = c.server_status().pop().unwrap().1.unwrap();
    println!(
        "server: no-session answers {}, dropped {}, sessions {}, peers {}, replies dropped {}",
        st.fabric_no_session,
        st.fabric_no_session_dropped,
        st.fabric_sessions,
        st.fabric_peers,
        st.fabric_replies_dropped
    );
    assert_eq!(
        told, clients_n,
        "the others waited out their timeout (8 s; the child's lines above say why)"
    );
    // (Three requests each: 0.5-1.4 s here, one each 0.1-0.4 s.)
    assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    assert!(child.0.wait().unwrap().success());
}

/// Run by `many_clients_of_a_restarted_server_are_told_at_once` in a
/// child process: 200 clients (an endpoint and a session each) of the
/// server it is given; once told (a line on stdin) that the server was
/// restarted, each sends three requests at once and the child says how
/// many clients had all three answered OP_NO_SESSION, and how long the
/// slowest waited.
#[test]
fn restart_clients_child() {
    use chfs_fabric::rpc::{RpcClient, OP_NO_SESSION};
    use chfs_fabric::{Config, Endpoint, Protocol};
    use chfs_proto::handshake::{Credential, Role};
    use std::sync::Arc;
    let (Ok(server), Ok(secret)) = (
        std::env::var("CHFS_TEST_CHILD_SERVER"),
        std::env::var("CHFS_TEST_CHILD_SECRET"),
    ) else {
        return;
    };
    let clients_n: usize = 200;
    let timeout = Duration::from_secs(8);
    let server: chfs_fabric::Address = server.parse().unwrap();
    let cred = Credential::parse(secret.as_bytes()).unwrap();
    let clients: Vec<_> = (0..clients_n)
        .map(|_| {
            let ep = Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap();
            let rpc = RpcClient::new(Arc::new(ep));
            let s = rpc
                .handshake(&server, Role::Client, &cred, timeout)
                .unwrap();
            (rpc, s)
        })
        .collect();
    println!("CLIENTS READY: {clients_n}");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "GO");
    let mut stat = Vec::new();
    chfs_proto::Request::Stat { path: "/".into() }.encode(&mut stat);
    let t0 = Instant::now();
    let waits: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = clients
            .iter()
            .map(|(rpc, s)| {
                let stat = &stat;
                sc.spawn(move || {
                    // As a link idle for a while does before it sends:
                    // the provider notices the ended connection.
                    rpc.progress();
                    // Three requests at once (a pipeline, or other
                    // threads' requests), each waited for as a link waits
                    // for those that left before it was answered after
                    // an idle spell: probing the session if unanswered.
                    let ids: Vec<_> = (0..3)
                        .map(|_| rpc.post(s, chfs_proto::msg::op::STAT, 0, stat, timeout))
                        .collect();
                    let mut all_told = true;
                    for id in ids {
                        let r = id.and_then(|id| rpc.wait_probing(s, id, timeout));
                        let told = r.as_ref().is_ok_and(|(h, _)| h.op == OP_NO_SESSION);
                        if !told {
                            println!(
                                "not told: {:?}",
                                r.map(|(h, _)| h.op).map_err(|e| e.to_string())
                            );
                        }
                        all_told &= told;
                    }
                    (all_told, t0.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let told = waits.iter().filter(|(t, _)| *t).count();
    let slowest = waits.iter().map(|(_, d)| *d).max().unwrap();
    println!(
        "TOLD {told} OF {clients_n} SLOWEST_MS {}",
        slowest.as_millis()
    );
}

/// Chunks a server pushed to clients by RMA are freed when the store lets
/// go of them (overwritten, removed): pushing a chunk does not keep its
/// memory alive (a registration cache that owned what it registered kept
/// up to 256 MiB of chunks the store had dropped, and the pull buffers
/// among them never went back to their pool). The DRAM engine's (whose
/// chunks are the server's heap: its RSS), whatever `CHFS_TEST_STORE`
/// says.
#[test]
fn chunks_pushed_by_rma_are_freed_with_the_file() {
    let Some(p) = fabric_pool_with(
        1,
        "chunks_pushed_by_rma_are_freed_with_the_file",
        &["--store", "mem"],
    ) else {
        return;
    };
    let pid = p.pid(0).unwrap();
    let rss = || chfs_localpool::rss_kib(pid) / 1024;
    let c = fabric_client(&p);
    c.set_chunk_size(1 << 20).unwrap();
    const FILES: usize = 10;
    const LEN: usize = 20 << 20;
    let data = pattern(LEN, 5);
    let mut back = vec![0u8; LEN];
    let start = rss();
    for round in 0..2 {
        for i in 0..FILES {
            let path = format!("/freed-{i}");
            let fd = c.create(&path, O_RDWR, 0o644).unwrap();
            assert_eq!(c.pwrite(fd, &data, 0).unwrap(), LEN);
            back.fill(0);
            assert_eq!(c.pread(fd, &mut back, 0).unwrap(), LEN);
            assert!(back == data, "round {round}, file {i}");
            c.close(fd).unwrap();
        }
    }
    let full = rss();
    assert!(
        full >= start + 150,
        "{} MiB stored, RSS {start} -> {full} MiB",
        (FILES * LEN) >> 20
    );
    for i in 0..FILES {
        c.unlink(&format!("/freed-{i}")).unwrap();
    }
    // (Removal is synchronous: a moment for the allocator anyway.)
    let t = Instant::now();
    let mut now = rss();
    while now + 100 > full && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        now = rss();
    }
    let st = c.server_status().pop().unwrap().1.unwrap();
    eprintln!("RSS {start} -> {full} -> {now} MiB");
    assert!(
        now + 100 <= full,
        "{} MiB stored and removed, RSS {start} -> {full} -> {now} MiB; {st:?}",
        (FILES * LEN) >> 20
    );
}

/// Waits until process `pid` is stopped (SIGSTOP).
fn wait_stopped(pid: u32) {
    let t = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
        .unwrap_or(false)
    {
        assert!(t.elapsed() < Duration::from_secs(5), "server not stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A request whose send the provider took but did not finish within the
/// request timeout (the server stopped) may still leave once the server
/// goes on, on a session it still knows: an append reservation (as an
/// exclusive create, a rename, a removal) is not sent again on a new
/// session, where it would be carried out a second time. Before: the
/// client sent it again once the server went on, and the append reserved
/// its bytes twice (the file grew by twice the write). Run in a child process
/// ([`fabric_send_timeout_child`]) where rxm sends every message over
/// 1 KiB by rendezvous (`FI_OFI_RXM_BUFFER_SIZE`, `FI_OFI_RXM_SAR_LIMIT`,
/// for the child and its servers): such a send is finished only when the
/// server takes it, as sends are on providers whose completion means
/// delivery (verbs).
#[test]
fn a_send_that_timed_out_is_not_sent_again() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_send_that_timed_out_is_not_sent_again",
            "built without libfabric",
        );
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "fabric_send_timeout_child", "--nocapture"])
        .env("CHFS_TEST_SEND_TIMEOUT_CHILD", "1")
        .env("FI_OFI_RXM_BUFFER_SIZE", "1024")
        .env("FI_OFI_RXM_SAR_LIMIT", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("SEND TIMEOUT CHILD DONE"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run by `a_send_that_timed_out_is_not_sent_again` in a child process.
#[test]
fn fabric_send_timeout_child() {
    if std::env::var("CHFS_TEST_SEND_TIMEOUT_CHILD").is_err() {
        return;
    }
    let p = fabric_pool(1, "fabric_send_timeout_child").expect("libfabric");
    let c = client(&p, |cfg| {
        cfg.secret = p.secret().unwrap().as_bytes().to_vec();
        cfg.rpc_timeout = Duration::from_secs(3);
    });
    // Paths long enough (over 1 KiB) for their requests to go by
    // rendezvous.
    let mut dir = String::new();
    for k in 0..6 {
        dir = format!("{dir}/{}", char::from(b'a' + k).to_string().repeat(200));
        c.mkdir(&dir, 0o755).unwrap();
    }
    let pid = p.pid(0).unwrap();
    let log = format!("{dir}/log");
    let fd = c.create(&log, O_WRONLY | O_APPEND, 0o644).unwrap();
    // The append, with the server stopped; the server goes on 5 s later
    // (after the request's send timed out, 3 s, before a handshake begun
    // then would).
    p.signal(0, libc::SIGSTOP).unwrap();
    wait_stopped(pid);
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(5));
        // SAFETY: a signal to the server this test started, by its PID.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    });
    let t = Instant::now();
    let r = c.write(fd, &[7u8; 100]);
    println!("append: {r:?} after {:?}", t.elapsed());
    resume.join().unwrap();
    // The first send, if it left, is carried out by now.
    std::thread::sleep(Duration::from_secs(1));
    let size = c.stat(&log).unwrap().size;
    assert!(
        size == 100 || (size == 0 && r.is_err()),
        "an append of 100 bytes grew the file to {size} ({r:?})"
    );
    println!("SEND TIMEOUT CHILD DONE");
}

/// A session of `role` (with the pool secret) with the server at `addr`,
/// over the transport's own RPC client.
fn fabric_session(
    rpc: &chfs_fabric::rpc::RpcClient,
    p: &LocalPool,
    addr: &str,
    role: chfs_proto::handshake::Role,
) -> chfs_fabric::rpc::Session {
    let cred = chfs_proto::handshake::Credential::parse(p.secret().unwrap().as_bytes()).unwrap();
    let a: chfs_fabric::Address = addr.parse().unwrap();
    rpc.handshake(&a, role, &cred, Duration::from_secs(10))
        .expect("handshake")
}

/// The status of the pool's only server.
fn status_of(c: &chfs_client::Client) -> chfs_proto::msg::ServerStatus {
    c.server_status().remove(0).1.expect("status")
}

/// Replies chfsd's outbox drops (a peer that takes none: over 16 posted
/// and 8 MiB queued) are counted in status (`fabric_replies_dropped`),
/// not only logged: a client that sends 400 listings of ~64 KiB and
/// reads none of the answers (its endpoint makes no progress) has replies
/// dropped, and counted.
#[test]
fn replies_dropped_for_a_client_that_takes_none_are_counted() {
    use chfs_proto::Request;
    let Some(p) = fabric_pool(
        1,
        "replies_dropped_for_a_client_that_takes_none_are_counted",
    ) else {
        return;
    };
    let c = fabric_client(&p);
    c.mkdir("/big", 0o755).unwrap();
    for i in 0..600 {
        let fd = c
            .create(&format!("/big/{i:0>100}"), O_WRONLY, 0o644)
            .unwrap();
        c.close(fd).unwrap();
    }
    assert_eq!(status_of(&c).fabric_replies_dropped, 0);
    let cfg = chfs_fabric::Config::new(chfs_fabric::Protocol::Tcp).bind("127.0.0.1", None);
    let ep = chfs_fabric::Endpoint::open(&cfg).expect("an ofi+tcp endpoint");
    let rpc = chfs_fabric::rpc::RpcClient::new(std::sync::Arc::new(ep));
    let s = fabric_session(&rpc, &p, &p.addrs()[0], chfs_proto::handshake::Role::Client);
    let mut head = Vec::new();
    Request::Readdir {
        path: "/big".into(),
        after: String::new(),
        max: 10_000,
    }
    .encode(&mut head);
    for _ in 0..400 {
        rpc.post(
            &s,
            chfs_proto::msg::op::READDIR,
            0,
            &head,
            Duration::from_secs(10),
        )
        .expect("post");
    }
    let t = Instant::now();
    let dropped = loop {
        let n = status_of(&c).fabric_replies_dropped;
        if n > 0 || t.elapsed() > Duration::from_secs(20) {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(dropped > 0, "no reply dropped: the test proves nothing");
    assert!(dropped <= 400, "{dropped}");
    drop(rpc);
    // The server serves the others meanwhile.
    assert_eq!(c.readdir("/big").unwrap().len(), 600);
}

/// A request larger than a message (`FLAG_LENT`) of an op the peer's role
/// may not make is refused before its payload is pulled (up to 256 MiB
/// from the sender's memory): a client-role session's `UpdateServers` of
/// 5,000 addresses is denied and nothing is pulled
/// (`fabric_lent_pulls`). Before: pulled first, then denied.
#[test]
fn a_lent_request_the_role_may_not_make_is_not_pulled() {
    use chfs_proto::Request;
    let Some(p) = fabric_pool(1, "a_lent_request_the_role_may_not_make_is_not_pulled") else {
        return;
    };
    let c = fabric_client(&p);
    let cfg = chfs_fabric::Config::new(chfs_fabric::Protocol::Tcp).bind("127.0.0.1", None);
    let ep = chfs_fabric::Endpoint::open(&cfg).expect("an ofi+tcp endpoint");
    let rpc = chfs_fabric::rpc::RpcClient::new(std::sync::Arc::new(ep));
    let mut list = match server_call(&rpc, &p, &p.addrs()[0], &Request::GetServers) {
        Ok(chfs_proto::Response::Servers(l)) => l,
        other => panic!("{other:?}"),
    };
    // The same version: the server that takes it (a server's, last)
    // keeps its list.
    list.servers
        .extend((0..4998).map(|i| format!("ofi+tcp://127.1.{}.{}:1", i / 250, i % 250 + 1)));
    let mut payload = Vec::new();
    Request::UpdateServers { list }.encode(&mut payload);
    assert!(payload.len() > 2 * (64 << 10), "{} bytes", payload.len());
    let before = status_of(&c);
    for role in [
        chfs_proto::handshake::Role::Client,
        chfs_proto::handshake::Role::Admin,
    ] {
        let s = fabric_session(&rpc, &p, &p.addrs()[0], role);
        let timeout = Duration::from_secs(10);
        let id = rpc
            .post(
                &s,
                chfs_proto::msg::op::UPDATE_SERVERS,
                0,
                &payload,
                timeout,
            )
            .expect("post");
        let (h, answer) = rpc.wait(&s, id, timeout).expect("an answer");
        assert!(
            h.flags & chfs_proto::frame::FLAG_ERROR != 0,
            "{role:?}: served"
        );
        let e = chfs_proto::msg::decode_error(answer).unwrap();
        assert_eq!(e.errno, libc::EPERM, "{role:?}: {}", e.message);
    }
    let after = status_of(&c);
    assert_eq!(after.denied, before.denied + 2);
    assert_eq!(
        after.fabric_lent_pulls, before.fabric_lent_pulls,
        "denied requests were pulled"
    );
    // A server's is pulled and served.
    let s = fabric_session(&rpc, &p, &p.addrs()[0], chfs_proto::handshake::Role::Server);
    let id = rpc
        .post(
            &s,
            chfs_proto::msg::op::UPDATE_SERVERS,
            0,
            &payload,
            Duration::from_secs(10),
        )
        .expect("post");
    let (h, _) = rpc
        .wait(&s, id, Duration::from_secs(10))
        .expect("an answer");
    assert_eq!(h.flags & chfs_proto::frame::FLAG_ERROR, 0);
    assert_eq!(
        status_of(&c).fabric_lent_pulls,
        before.fabric_lent_pulls + 1
    );
}

/// The RMA operations chfsd has in flight for one client are bounded
/// (`fabric::RMA_PER_PEER`, 32; the rest of its requests wait): a client
/// with 4 threads writing and reading 288 KiB chunks by RMA (a request
/// each: larger than those written and read by server), 128 in flight
/// each, gets its data through and the server never had more than 32 of
/// its RMA operations in flight (`fabric_rma_most`). Before: as many as
/// the client sent (the same test saw 100 and more).
#[test]
fn rma_operations_in_flight_per_client_are_bounded() {
    let Some(p) = fabric_pool(1, "rma_operations_in_flight_per_client_are_bounded") else {
        return;
    };
    let c = std::sync::Arc::new(client(&p, |cfg| {
        cfg.secret = p.secret().unwrap().as_bytes().to_vec();
        cfg.window = 128;
    }));
    c.set_chunk_size(288 << 10).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let data = pattern(128 * (288 << 10), t);
                let path = format!("/rma{t}");
                let fd = c.create(&path, O_RDWR, 0o644).unwrap();
                for _ in 0..2 {
                    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
                    let mut back = vec![0u8; data.len()];
                    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
                    assert!(back == data, "{path}: data differs");
                }
                c.close(fd).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = status_of(&c);
    assert!(s.rma_pulls >= 4 * 2 * 128, "{s:?}");
    assert!(
        s.fabric_rma_most > 1 && s.fabric_rma_most <= 32,
        "most RMA operations in flight for the client: {}",
        s.fabric_rma_most
    );
}

/// A flood of hellos that all name one address where nobody answers is
/// bounded as one naming many: the address is in the server's address
/// vector from its first hello on, which does not make its next 2,000
/// hellos a known client's. Before: only hellos from addresses not in the
/// address vector counted against the bound of welcomes in flight, so
/// every hello after the first took a blocking thread for 10 s, none was
/// dropped, and a client's sync waited for one.
#[test]
fn a_flood_of_hellos_from_one_address_is_bounded() {
    use chfs_fabric::rpc::{encode_hello, encode_message, OP_AUTH_HELLO};
    use chfs_fabric::{Config, Endpoint, Protocol};
    let Some(p) = fabric_pool(1, "a_flood_of_hellos_from_one_address_is_bounded") else {
        return;
    };
    let c = fabric_client(&p);
    c.mkdir("/before", 0o755).unwrap();
    let server: chfs_fabric::Address = p.addrs()[0].parse().unwrap();
    let ep = Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap();
    let peer = ep.connect(&server).unwrap();
    const FLOOD: u64 = 2000;
    for i in 0..FLOOD {
        let m = encode_message(
            0,
            i + 1,
            OP_AUTH_HELLO,
            0,
            &encode_hello("ofi+tcp://127.3.0.1:1", 1, b"hello"),
        );
        ep.send(peer, &m, Duration::from_secs(5)).unwrap();
    }
    let t = Instant::now();
    c.sync().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a sync during the flood took {:?}",
        t.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = status_of(&c);
    while st.refused + st.fabric_hellos_dropped < FLOOD {
        assert!(Instant::now() < deadline, "not all seen: {st:?}");
        std::thread::sleep(Duration::from_millis(100));
        st = status_of(&c);
    }
    assert!(st.fabric_hellos_dropped >= FLOOD / 2, "{st:?}");
}

/// A flood of hellos naming addresses where nobody answers (each welcome
/// a send that waits out its timeout, 10 s, on a blocking thread) is
/// bounded: the server's other work that needs a blocking thread (a
/// `sync`) and its open sessions go on, and the hellos beyond the bound
/// are dropped and counted (`fabric_hellos_dropped`). Before: every
/// welcome took a blocking thread for 10 s, and a client's sync waited
/// for the runtime's 512 of them to come free: it timed out (10 s), and
/// so did the new session its client then opened.
#[test]
fn a_flood_of_hellos_is_bounded() {
    use chfs_fabric::rpc::{encode_hello, encode_message, OP_AUTH_HELLO};
    use chfs_fabric::{Config, Endpoint, Protocol};
    let Some(p) = fabric_pool(1, "a_flood_of_hellos_is_bounded") else {
        return;
    };
    let c = fabric_client(&p);
    c.mkdir("/before", 0o755).unwrap();
    let server: chfs_fabric::Address = p.addrs()[0].parse().unwrap();
    let ep = Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap();
    let peer = ep.connect(&server).unwrap();
    const FLOOD: u64 = 2000;
    for i in 0..FLOOD {
        let from = format!("ofi+tcp://127.3.{}.{}:1", i / 250, i % 250 + 1);
        // A hello refused at once (no such largest message): its refusal
        // is a welcome like any.
        let m = encode_message(
            0,
            i + 1,
            OP_AUTH_HELLO,
            0,
            &encode_hello(&from, 1, b"hello"),
        );
        ep.send(peer, &m, Duration::from_secs(5)).unwrap();
    }
    // A sync takes a blocking thread of the server's runtime.
    let t = Instant::now();
    c.sync().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a sync during the flood took {:?}",
        t.elapsed()
    );
    c.mkdir("/during", 0o755).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = status_of(&c);
    while st.refused + st.fabric_hellos_dropped < FLOOD {
        assert!(Instant::now() < deadline, "not all seen: {st:?}");
        std::thread::sleep(Duration::from_millis(100));
        st = status_of(&c);
    }
    assert!(st.fabric_hellos_dropped >= FLOOD / 2, "{st:?}");
    assert!(st.refused >= 100, "{st:?}");
    // Once the welcomes in flight have ended (10 s at most), a new client
    // is served.
    std::thread::sleep(Duration::from_secs(11));
    let t = Instant::now();
    let other = fabric_client(&p);
    other.mkdir("/after", 0o755).unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// Sum over the servers of their `reads` counter (a `Read` or a
/// `ReadSpans` each).
fn server_reads(c: &chfs_client::Client) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).reads)
        .sum()
}

/// Over the fabric, a read of several chunks is one `ReadSpans` per server
/// (its data by one RMA each), not one `Read` per chunk; the bytes are
/// those of plain reads whatever the offset and length: holes, the end
/// of the file, chunk boundaries, reads past the end.
#[test]
fn multi_chunk_reads_over_the_fabric_cost_one_request_per_server() {
    let Some(p) = fabric_pool(
        2,
        "multi_chunk_reads_over_the_fabric_cost_one_request_per_server",
    ) else {
        return;
    };
    let c = fabric_client(&p);
    for cs in [4096u32, 65536] {
        c.set_chunk_size(cs).unwrap();
        let path = format!("/f{cs}");
        let size = 40 * cs as usize + 1000;
        let mut want = pattern(size, cs as u64);
        // A hole of three chunks and a bit (never written).
        let hole = (5 * cs as usize + 100)..(8 * cs as usize + 200);
        want[hole.clone()].fill(0);
        let fd = c.create(&path, O_RDWR, 0o644).unwrap();
        c.pwrite(fd, &want[..hole.start], 0).unwrap();
        c.pwrite(fd, &want[hole.end..], hole.end as u64).unwrap();
        c.close(fd).unwrap();
        let fd = c.open(&path, O_RDONLY, 0).unwrap();
        // 16 chunks from offset 0: 2 requests, not 16.
        let before = server_reads(&c);
        let mut b = vec![0u8; 16 * cs as usize];
        assert_eq!(c.pread(fd, &mut b, 0).unwrap(), b.len());
        assert!(b[..] == want[..b.len()]);
        assert_eq!(server_reads(&c) - before, 2, "chunk size {cs}");
        // Any offset and length.
        let mut seed = cs as u64;
        for i in 0..60 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (seed >> 33) as usize % (size + cs as usize);
            let len = 1 + (seed >> 13) as usize % (20 * cs as usize);
            let mut b = vec![0xAAu8; len];
            let n = c.pread(fd, &mut b, off as u64).unwrap();
            let end = (off + len).min(size);
            let expect = end.saturating_sub(off);
            assert_eq!(n, expect, "read {i}: {len} bytes at {off} of {size}");
            assert!(
                b[..n] == want[off.min(size)..][..n],
                "read {i}: {len} bytes at {off}"
            );
        }
        c.close(fd).unwrap();
    }
}

thread_local! {
    /// The requests the client sent for the last `write_counted`.
    static RPCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Sum of a counter over every server of the pool.
fn summed(c: &chfs_client::Client, f: fn(&chfs_proto::msg::ServerStatus) -> u64) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| f(&s.unwrap_or_else(|e| panic!("status of {a}: {e}"))))
        .sum()
}

/// Writes `data` at `off` of `path` (created), reads it back whole and
/// returns the requests and RMA pulls the servers counted for the write
/// (`RPCS`: the requests this client sent for it).
fn write_counted(c: &chfs_client::Client, path: &str, data: &[u8], off: u64) -> (u64, u64) {
    let fd = c.create(path, O_RDWR, 0o644).unwrap();
    let (r0, p0) = (summed(c, |s| s.requests), summed(c, |s| s.rma_pulls));
    let sent = c.stats().rpcs;
    assert_eq!(c.pwrite(fd, data, off).unwrap(), data.len());
    RPCS.with(|r| r.set(c.stats().rpcs - sent));
    let (r1, p1) = (summed(c, |s| s.requests), summed(c, |s| s.rma_pulls));
    let mut back = vec![0u8; data.len() + 5];
    assert_eq!(c.pread(fd, &mut back, off).unwrap(), data.len());
    assert!(back[..data.len()] == *data, "{path}");
    c.close(fd).unwrap();
    // (less the status requests between the counts: two per server)
    let servers = c.server_status().len() as u64;
    (r1 - r0 - 2 * servers, p1 - p0)
}

/// Over `ofi+tcp`, a write of several chunks of up to 256 KiB goes to
/// each server in one `WriteSpans` (its pieces gathered into one buffer
/// the server pulls), not a `Write` and a pull per chunk: a 1 MiB write
/// of 64 KiB chunks to two servers is two requests and two pulls, was
/// sixteen of each. The bytes are those written, at any offset.
#[test]
fn writes_of_small_chunks_go_by_server_over_ofi_tcp() {
    let Some(p) = fabric_pool(2, "writes_of_small_chunks_go_by_server_over_ofi_tcp") else {
        return;
    };
    let c = fabric_client(&p);
    c.set_chunk_size(65536).unwrap();
    let writes0 = summed(&c, |s| s.writes);
    let (reqs, pulls) = write_counted(&c, "/a", &pattern(1 << 20, 1), 0);
    assert_eq!((reqs, pulls), (2, 2));
    assert_eq!(summed(&c, |s| s.writes) - writes0, 16);
    // At an odd offset, a length that is not a whole number of chunks.
    let (reqs, _) = write_counted(&c, "/b", &pattern((1 << 20) + 12_345, 2), 777);
    assert!(reqs <= 4, "{reqs} requests");
    // Larger chunks than 256 KiB: a request per chunk, as before.
    c.set_chunk_size(1 << 20).unwrap();
    let (reqs, pulls) = write_counted(&c, "/c", &pattern(4 << 20, 3), 0);
    assert_eq!((reqs, pulls), (4, 4));
}

/// Servers that do not know `WriteSpans` (an older chfsd) are written
/// chunk by chunk: the first refusal is sent again as plain writes, and
/// the server is not asked again. The bytes are those written.
#[test]
fn servers_without_write_spans_are_written_chunk_by_chunk() {
    let Some(p) = fabric_pool_with(
        2,
        "servers_without_write_spans_are_written_chunk_by_chunk",
        &["--unknown-op", "WRITE_SPANS"],
    ) else {
        return;
    };
    let c = fabric_client(&p);
    c.set_chunk_size(65536).unwrap();
    // The two refused (not served), then the sixteen chunks.
    let (reqs, _) = write_counted(&c, "/a", &pattern(1 << 20, 1), 0);
    assert_eq!((reqs, RPCS.with(|r| r.get())), (16, 18));
    // Not asked again.
    let (reqs, _) = write_counted(&c, "/b", &pattern(1 << 20, 2), 65536 * 3 + 5);
    assert_eq!((reqs, RPCS.with(|r| r.get())), (17, 17));
}

/// A client whose server list is out of date (a server joined since) has
/// some of its `WriteSpans` refused (ESTALE: chunks no longer that
/// server's): those pieces are written plainly, and every byte is there.
#[test]
fn write_spans_of_an_outdated_list_are_written_plainly() {
    let Some(mut p) = fabric_pool(2, "write_spans_of_an_outdated_list_are_written_plainly") else {
        return;
    };
    let c = fabric_client(&p);
    c.set_chunk_size(65536).unwrap();
    let _ = write_counted(&c, "/before", &pattern(1 << 20, 1), 0);
    p.add_server().expect("a third server");
    let data = pattern(4 << 20, 2);
    let _ = write_counted(&c, "/after", &data, 0);
    // The two requests of the old list, refused (each names chunks that
    // are the new server's now), then the 64 chunks one by one.
    assert_eq!(RPCS.with(|r| r.get()), 2 + 64);
    let other = fabric_client(&p);
    let fd = other.open("/after", O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(other.pread(fd, &mut back, 0).unwrap(), data.len());
    assert!(back == data);
}

/// `ReadSpansPlaced` as chfsd answers it: each span's bytes written by RMA
/// at its place in the file (from the first span's) in memory the client
/// exposes, the bytes between them untouched; spans out of file order
/// refused (EINVAL) and memory too short for the last span refused
/// (EMSGSIZE), nothing written; without `FLAG_RMA` answered as a
/// `ReadSpans` (the spans one after the other).
#[test]
fn placed_spans_land_at_their_places_over_ofi_tcp() {
    use chfs_fabric::rpc::{RpcClient, FLAG_RMA};
    use chfs_fabric::{Config, Endpoint, Protocol, RemoteKey};
    use chfs_proto::{Request, Response};
    let Some(p) = fabric_pool(1, "placed_spans_land_at_their_places_over_ofi_tcp") else {
        return;
    };
    let c = fabric_client(&p);
    c.set_chunk_size(65536).unwrap();
    let data = pattern(8 * 65536, 7);
    let fd = c.create("/pl", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    c.close(fd).unwrap();
    let t = Duration::from_secs(10);
    let rpc = RpcClient::new(std::sync::Arc::new(
        Endpoint::open(&Config::new(Protocol::Tcp).bind("127.0.0.1", None)).unwrap(),
    ));
    let s = fabric_session(&rpc, &p, &p.addrs()[0], chfs_proto::handshake::Role::Client);
    let call = |req: &Request, flags: u16, key: Option<RemoteKey>| {
        let mut b = Vec::new();
        req.encode(&mut b);
        if let Some(k) = key {
            b.extend_from_slice(&k.encode());
        }
        let id = rpc.post(&s, req.op(), flags, &b, t).unwrap();
        let (h, payload) = rpc.wait(&s, id, t).unwrap();
        if h.flags & chfs_proto::frame::FLAG_ERROR != 0 {
            return Err(chfs_proto::msg::decode_error(payload).unwrap().errno);
        }
        Ok(Response::decode(payload).unwrap())
    };
    let Ok(Response::Meta(meta)) = call(&Request::Stat { path: "/pl".into() }, 0, None) else {
        panic!("no entry");
    };
    let placed = |spans: Vec<(u64, u32, u32)>| Request::ReadSpansPlaced {
        path: "/pl".into(),
        fileid: meta.fileid,
        chunk_size: 65536,
        flags: 0,
        epoch: meta.epoch(),
        spans,
    };
    let spans = vec![(1u64, 100u32, 1000u32), (3, 0, 65536), (6, 60_000, 5536)];
    let first = 65536 + 100;
    let extent = 6 * 65536 + 65536 - first;
    let mut mem = vec![0xEEu8; extent];
    let mut want = mem.clone();
    for &(idx, off, len) in &spans {
        let at = idx as usize * 65536 + off as usize;
        want[at - first..][..len as usize].copy_from_slice(&data[at..][..len as usize]);
    }
    rpc.endpoint()
        .clone()
        .expose_mut(&mut mem, |key| {
            // Out of order, and memory short of the last span: refused.
            let back = vec![(3u64, 0u32, 10u32), (1, 0, 10)];
            assert_eq!(call(&placed(back), FLAG_RMA, Some(key)), Err(libc::EINVAL));
            let short = RemoteKey {
                len: extent as u64 - 1,
                ..key
            };
            let e = call(&placed(spans.clone()), FLAG_RMA, Some(short));
            assert_eq!(e, Err(libc::EMSGSIZE));
            let r = call(&placed(spans.clone()), FLAG_RMA, Some(key));
            assert_eq!(r, Ok(Response::Written(1000 + 65536 + 5536)));
        })
        .unwrap();
    assert!(mem == want, "each span at its place, the rest untouched");
    // In the message: the spans one after the other.
    let small = vec![(1u64, 0u32, 100u32), (2, 5, 50)];
    let r = call(&placed(small), 0, None).unwrap();
    let packed = [&data[65536..65636], &data[2 * 65536 + 5..][..50]].concat();
    assert_eq!(r, Response::Data(bytes::Bytes::from(packed)));
}

/// Servers that do not know `ReadSpansPlaced` (an older chfsd) are read
/// with a `ReadSpans` per server: the first refusal makes that read a
/// plain one, and the server is not asked again. The bytes are right.
#[test]
fn servers_without_placed_reads_are_read_by_spans() {
    let Some(p) = fabric_pool_with(
        2,
        "servers_without_placed_reads_are_read_by_spans",
        &["--unknown-op", "READ_SPANS_PLACED"],
    ) else {
        return;
    };
    let c = fabric_client(&p);
    c.set_chunk_size(65536).unwrap();
    let data = pattern(2 << 20, 3);
    let fd = c.create("/r", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    let read = |off: usize| {
        let sent = c.stats().rpcs;
        let mut b = vec![0u8; 1 << 20];
        assert_eq!(c.pread(fd, &mut b, off as u64).unwrap(), b.len());
        assert!(b[..] == data[off..][..1 << 20], "at {off}");
        c.stats().rpcs - sent
    };
    // The two refused, then the sixteen chunks; then a ReadSpans each.
    assert_eq!(read(0), 18);
    assert_eq!(read(65536 * 5 + 7), 2);
    c.close(fd).unwrap();
}

/// A server killed while placed reads are in flight (64 KiB chunks: each
/// `pread` lends the caller's buffer once to both servers): the read
/// fails with an errno within the RPC timeout, the lending ends with the
/// call, and the server left still serves.
#[test]
fn a_server_killed_mid_placed_read_gives_an_errno() {
    let Some(mut p) = fabric_pool(2, "a_server_killed_mid_placed_read_gives_an_errno") else {
        return;
    };
    let c = killing_client(&p);
    c.set_chunk_size(65536).unwrap();
    let data = pattern(32 << 20, 4);
    let fd = c.create("/placed", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    let t = Instant::now();
    let r = std::thread::scope(|s| {
        let w = s.spawn(|| {
            let mut b = vec![0u8; 4 << 20];
            for i in 0..10_000usize {
                let off = (i % 8) * (4 << 20);
                c.pread(fd, &mut b, off as u64)?;
                assert!(b[..] == data[off..][..4 << 20], "read {i}");
            }
            Ok::<_, chfs_client::Error>(())
        });
        std::thread::sleep(Duration::from_millis(300));
        p.kill(1);
        w.join().unwrap()
    });
    failed_in_time(r.expect_err("reads from a killed server fail"), t);
    server_0_serves(&c);
}
