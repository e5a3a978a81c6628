//! Several clients writing one shared file concurrently.

mod common;

use std::sync::Arc;

use chfs_client::flags::*;
use common::*;

const REC: usize = 47_008;

/// IOR-hard pattern: each of `n` clients (own connections) writes every
/// n-th 47,008-byte record of one shared file; records cross chunk
/// boundaries (64 KiB chunks), so neighbours write disjoint ranges of the
/// same chunks at the same time. The result must be byte-exact.
#[test]
fn disjoint_unaligned_records_from_many_clients() {
    let pool = LocalPool::start(3).unwrap();
    let clients = 4;
    let per_client = 24;
    let setup = client(&pool, |_| {});
    let fd = setup
        .open_chunk_size("/shared", O_CREAT | O_WRONLY, 0o644, 64 << 10)
        .unwrap();
    setup.close(fd).unwrap();
    let pool = Arc::new(pool);
    let threads: Vec<_> = (0..clients)
        .map(|r| {
            let c = client(&pool, |_| {});
            std::thread::spawn(move || {
                let fd = c.open("/shared", O_WRONLY, 0).unwrap();
                for i in 0..per_client {
                    let rec = i * clients + r;
                    let data = pattern(REC, rec as u64);
                    assert_eq!(c.pwrite(fd, &data, (rec * REC) as u64).unwrap(), REC);
                }
                c.close(fd).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = clients * per_client * REC;
    let reader = client(&pool, |_| {});
    assert_eq!(reader.stat("/shared").unwrap().size, total as u64);
    let fd = reader.open("/shared", O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; total];
    assert_eq!(reader.pread(fd, &mut buf, 0).unwrap(), total);
    for rec in 0..clients * per_client {
        assert!(
            buf[rec * REC..(rec + 1) * REC] == pattern(REC, rec as u64)[..],
            "record {rec} differs"
        );
    }
}

/// One client shared by many threads (each with its own descriptor).
#[test]
fn one_client_many_threads() {
    let (_p, c) = pool(2);
    c.mkdir("/t", 0o755).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let p = format!("/t/f{t}-{i}");
                    let data = pattern(1000 + i * 100, (t * 100 + i) as u64);
                    let fd = c.create(&p, O_RDWR, 0o644).unwrap();
                    c.pwrite(fd, &data, 0).unwrap();
                    let mut back = vec![0u8; data.len()];
                    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
                    assert_eq!(back, data);
                    c.close(fd).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(c.readdir("/t").unwrap().len(), 160);
}

/// Threads of one client share its connections: whichever waits first
/// reads the socket and files the others' replies (large multi-chunk reads
/// and small stats interleaved); every thread gets its own answer.
#[test]
fn shared_connections_file_replies_for_other_threads() {
    let (_p, c) = pool(2);
    let big = pattern(3 << 20, 77);
    let fd = c
        .open_chunk_size("/big", O_CREAT | O_WRONLY, 0o644, 64 << 10)
        .unwrap();
    c.pwrite(fd, &big, 0).unwrap();
    c.close(fd).unwrap();
    for i in 0..50 {
        c.mkdir(&format!("/d{i}"), 0o700 + (i % 8) as u32).unwrap();
    }
    let big = Arc::new(big);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (c, big) = (c.clone(), big.clone());
            std::thread::spawn(move || {
                for round in 0..10 {
                    if t % 2 == 0 {
                        let fd = c.open("/big", O_RDONLY, 0).unwrap();
                        let off = (round * 100_003) % (1 << 20);
                        let mut buf = vec![0u8; 2 << 20];
                        assert_eq!(c.pread(fd, &mut buf, off as u64).unwrap(), 2 << 20);
                        assert!(
                            buf[..] == big[off..off + (2 << 20)],
                            "thread {t} round {round}"
                        );
                        c.close(fd).unwrap();
                    } else {
                        for i in 0..50 {
                            let s = c.stat(&format!("/d{i}")).unwrap();
                            assert_eq!(s.mode & 0o7777, 0o700 + (i % 8) as u32);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// O_APPEND from several clients: every record lands whole, none is lost.
#[test]
fn concurrent_appends_do_not_overwrite() {
    let pool = Arc::new(LocalPool::start(2).unwrap());
    let c0 = client(&pool, |_| {});
    let fd = c0.create("/log", O_WRONLY, 0o644).unwrap();
    c0.close(fd).unwrap();
    let threads: Vec<_> = (0..3u8)
        .map(|t| {
            let c = client(&pool, |_| {});
            std::thread::spawn(move || {
                let fd = c.open("/log", O_WRONLY | O_APPEND, 0).unwrap();
                for _ in 0..30 {
                    c.write(fd, &[b'a' + t; 100]).unwrap();
                }
                c.close(fd).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let fd = c0.open("/log", O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 9000];
    assert_eq!(c0.pread(fd, &mut buf, 0).unwrap(), 9000);
    for rec in buf.chunks(100) {
        assert!(
            rec.iter().all(|&b| b == rec[0]) && (b'a'..=b'c').contains(&rec[0]),
            "torn or lost record"
        );
    }
}

/// Reads' data lands straight in the caller's buffer when the caller
/// reads its reply off the shared connection: many threads of one client
/// read distinct files at once (47,008-byte records, some running past the
/// end of file), with error replies (missing files) and multi-chunk reads
/// in flight on the same connections; every byte must be the file's, and
/// nothing past what a read returns may be touched.
#[test]
fn direct_reads_land_in_the_right_buffer() {
    let (_p, c) = pool(2);
    direct_reads(c);
}

/// The same over TCP (where replies arrive in segments of any size).
#[test]
fn direct_reads_land_in_the_right_buffer_over_tcp() {
    let p = common::LocalPool::start(2).expect("start chfsd pool");
    direct_reads(common::client(&p, |cfg| {
        cfg.local_socket = false;
        cfg.cma = false;
    }));
}

fn direct_reads(c: chfs_client::Client) {
    let threads = 8;
    let files: Vec<Vec<u8>> = (0..threads)
        .map(|t| pattern(300_000 + t * 7_919, 1000 + t as u64))
        .collect();
    // Reads of one chunk, and of two or more (64 KiB chunks).
    let cs = [1 << 20, 64 << 10];
    for (t, data) in files.iter().enumerate() {
        let fd = c
            .open_chunk_size(&format!("/r{t}"), O_CREAT | O_WRONLY, 0o644, cs[t % 2])
            .unwrap();
        assert_eq!(c.pwrite(fd, data, 0).unwrap(), data.len());
        c.close(fd).unwrap();
    }
    let files = Arc::new(files);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (c, files) = (c.clone(), files.clone());
            std::thread::spawn(move || {
                let data = &files[t];
                let fd = c.open(&format!("/r{t}"), O_RDONLY, 0).unwrap();
                let mut buf = vec![0u8; REC + 16];
                for i in 0..200usize {
                    if (i + t) % 5 == 0 {
                        let e = c.stat(&format!("/missing{t}-{i}")).unwrap_err();
                        assert_eq!(e.errno(), libc::ENOENT);
                    }
                    // Offsets all over the file, some near its end.
                    let off = (i * 31_337 + t * 101) % (data.len() + 1000);
                    buf.fill(0xa5);
                    let n = c.pread(fd, &mut buf[..REC], off as u64).unwrap();
                    let want = data.len().saturating_sub(off).min(REC);
                    assert_eq!(n, want, "thread {t} read {i} at {off}");
                    assert!(
                        n == 0 || buf[..n] == data[off..off + n],
                        "thread {t} read {i} at {off}: wrong data"
                    );
                    assert!(
                        buf[n..].iter().all(|&b| b == 0xa5),
                        "thread {t} read {i} at {off}: bytes past the read changed"
                    );
                    if i % 50 == 0 {
                        // The whole file into a larger buffer: short at EOF.
                        let mut all = vec![0u8; data.len() + 5000];
                        assert_eq!(c.pread(fd, &mut all, 0).unwrap(), data.len());
                        assert!(all[..data.len()] == data[..]);
                    }
                }
                c.close(fd).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
