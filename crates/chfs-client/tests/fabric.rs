//! The client over a libfabric transport: chfsd processes started with
//! `-p ofi+tcp` advertise `ofi+tcp://IP:PORT` addresses, and a client
//! given one reaches every server over the fabric (doc/fabric.md).

mod common;

use std::time::{Duration, Instant};

use chfs_client::flags::*;
use common::*;

/// A pool of `n` servers over `ofi+tcp` with a secret, or None (skipped)
/// where this build has no libfabric.
fn fabric_pool(n: usize, test: &str) -> Option<LocalPool> {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric");
        return None;
    }
    let p = LocalPool::start_with(
        PoolOptions {
            servers: n,
            args: vec!["-p".into(), "ofi+tcp".into()],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd pool over ofi+tcp");
    Some(p)
}

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
    for thresh in [32 * 1024, 4096] {
        let c = client(&p, |c| {
            c.secret = p.secret().unwrap().as_bytes().to_vec();
            c.rdma_thresh = thresh;
        });
        for cs in [1 << 20, 4 << 20, 65_536, 40_000] {
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
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_secs(3);
    });
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
    assert_eq!(e.errno(), libc::ECONNREFUSED, "{e}");
}
