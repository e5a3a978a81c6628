//! Over `ofi+shm` (whose provider does not revoke a closed registration)
//! the windows of requests that got no answer are never freed; they are
//! bounded (`fabric_link::QUARANTINE_MAX`, 64 MiB). A test binary of its
//! own: the quarantine is the process's.

mod common;

use std::time::Duration;

use chfs_client::flags::*;
use common::*;

/// A server that stops answering (SIGSTOP) while 80 MiB of 1 MiB chunks
/// are written to it over `ofi+shm` leaves their windows quarantined;
/// once the quarantine holds 64 MiB, a transfer that would lend a new
/// window fails with ENOBUFS (the server answering again), one whose data
/// fits a message goes in the message, and the rest is served as before. Before, every such window was kept: the process gave
/// up 80 MiB here, and a chunk per unanswered request without end.
#[test]
fn the_shm_quarantine_is_bounded() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "the_shm_quarantine_is_bounded",
            "built without libfabric",
        );
        return;
    }
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 1,
            args: vec!["-p".into(), "ofi+shm".into()],
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd over ofi+shm");
    let c = client(&p, |c| {
        c.secret = p.secret().unwrap().as_bytes().to_vec();
        c.rpc_timeout = Duration::from_millis(1500);
    });
    c.set_chunk_size(1 << 20).unwrap();
    let data = pattern(80 << 20, 1);
    let fd = c.create("/big", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &data[..2 << 20], 0).unwrap(), 2 << 20);
    // Rounds of writes the stopped server never answers, until a 1 MiB
    // write to the server answering again fails with ENOBUFS (a round
    // quarantines up to a pipeline's 64 windows of 1 MiB).
    let mut rounds = 0;
    let e = loop {
        rounds += 1;
        assert!(rounds <= 16, "the quarantine never filled up");
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            p.signal(0, libc::SIGSTOP).unwrap();
            // A watchdog resumes the server if the write has not returned
            // after 5 s: over shm a client can spin inside the provider
            // (fi_inject, on a lock of the stopped server's queue) until
            // the server runs again, which hung this test in CI.
            s.spawn(|| {
                let t = std::time::Instant::now();
                while !done.load(std::sync::atomic::Ordering::Acquire)
                    && t.elapsed() < Duration::from_secs(5)
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                p.signal(0, libc::SIGCONT).unwrap();
            });
            // 8 chunks at a time: more requests than the stopped server's
            // queue holds make the client spin in the provider (above)
            // instead of waiting out its timeout.
            let _ = c.pwrite(fd, &data[..8 << 20], 0);
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        std::thread::sleep(Duration::from_millis(200));
        match c.pwrite(fd, &data[..1 << 20], 0) {
            Ok(n) => assert_eq!(n, 1 << 20),
            Err(e) => break e,
        }
    };
    assert_eq!(e.errno(), libc::ENOBUFS, "{e}");
    eprintln!("quarantine full after {rounds} round(s): {e}");
    let mut back = vec![0u8; 1 << 20];
    let e = c.pread(fd, &mut back, 0).unwrap_err();
    assert_eq!(e.errno(), libc::ENOBUFS, "{e}");
    // Small ones are served; data that fits a message goes in it (64 KiB
    // chunks: above the RDMA threshold, below a message).
    c.close(fd).ok();
    c.mkdir("/d", 0o755).unwrap();
    c.set_chunk_size(65_536).unwrap();
    let small = pattern(300_000, 2);
    let fd = c.create("/small", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &small, 0).unwrap(), small.len());
    let mut back = vec![0u8; small.len() + 10];
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), small.len());
    assert!(back[..small.len()] == small[..]);
    c.close(fd).unwrap();
}
