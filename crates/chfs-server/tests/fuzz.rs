//! A live pool under random input. For a bounded time, threads throw random
//! and mutated-valid input at every port of a pool with a secret (TCP and
//! the local socket of each server):
//!
//! 1. without the key: random bytes, hellos of every role (also mutated
//!    ones) answered with wrong proofs, a replayed transcript of a real
//!    client, frames without a handshake. Every handshake is refused and
//!    the server closes the connection once the input ends.
//! 2. with the client key: random frames and mutations of a valid request
//!    of every opcode, with every flag. Every reply the server sends is a
//!    well-formed frame whose payload decodes.
//!
//! Afterwards every server answers, its memory stayed bounded, canary files
//! hold their bytes, the first phase changed nothing (entries and bytes of
//! every server) and no server log shows a panic.
//!
//! `CHFS_FUZZ_SECS` sets the time of each phase (default 5 s, longer runs:
//! `CHFS_FUZZ_SECS=300 cargo test -p chfs-server --test fuzz -- --nocapture`);
//! `CHFS_FUZZ_SEED` repeats a run (the seed is printed). A failure found
//! this way becomes a test in `bad_input.rs`.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_proto::frame::{Header, FLAG_CMA, FLAG_ERROR, FLAG_FORWARDED, HEADER_LEN, MAX_PAYLOAD};
use chfs_proto::handshake::{Auth, Hello, Role, NONCE_LEN};
use chfs_proto::msg::{decode_error, op, RemoveKind, SetAttr, TimeSet};
use chfs_proto::ring::{Hashing, ServerList};
use chfs_proto::{Meta, Request, Response, PROTOCOL_VERSION};
use common::*;

/// Canary files (one chunk each) and their size.
const CANARIES: usize = 4;
const CANARY_LEN: usize = 4096;
/// Threads per phase (the servers need the machine's CPUs too).
const THREADS: u64 = 3;

/// SplitMix64: small, seedable, good enough to pick bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A connection over TCP or the local socket.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn open(addr: &str, local: bool) -> Conn {
        let c = if local {
            Conn::Unix(local_raw(addr))
        } else {
            Conn::Tcp(TcpStream::connect(addr).unwrap())
        };
        c.timeout(Duration::from_secs(20));
        c
    }
    fn timeout(&self, t: Duration) {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(Some(t)).unwrap(),
            Conn::Unix(s) => s.set_read_timeout(Some(t)).unwrap(),
        }
    }
    fn try_clone(&self) -> Conn {
        match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone().unwrap()),
            Conn::Unix(s) => Conn::Unix(s.try_clone().unwrap()),
        }
    }
    fn end_input(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
            Conn::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Records what is written through it (a transcript to replay).
struct Recorder<'a> {
    inner: &'a mut Conn,
    sent: Vec<u8>,
}

impl Read for Recorder<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(b)
    }
}

impl Write for Recorder<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(b)?;
        self.sent.extend_from_slice(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A valid request of every opcode, on paths under `/fuzz` (never a
/// prefix of a canary's path).
fn corpus() -> Vec<Request> {
    let file = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 4096,
        fileid: 9,
        ..Default::default()
    };
    let dir = Meta {
        mode: libc::S_IFDIR | 0o755,
        chunk_size: 4096,
        ..Default::default()
    };
    let p = |s: &str| s.to_string();
    vec![
        Request::Ping,
        Request::GetServers,
        Request::Status,
        Request::Shutdown,
        Request::Sync,
        Request::Join {
            addr: p("127.0.0.1:1"),
            fresh: true,
        },
        Request::UpdateServers {
            list: ServerList {
                version: 99,
                hashing: Hashing::Modular,
                servers: vec![p("127.0.0.1:1")],
                since: vec![0],
            },
        },
        Request::Create {
            path: p("/fuzz/a"),
            meta: file,
            excl: false,
            data: Bytes::from(vec![1u8; 100]),
        },
        Request::Create {
            path: p("/fuzz/d"),
            meta: dir,
            excl: true,
            data: Bytes::new(),
        },
        Request::Stat { path: p("/fuzz/a") },
        Request::Write {
            path: p("/fuzz/a"),
            fileid: 9,
            chunk_size: 4096,
            mode: file.mode,
            idx: 1,
            off: 10,
            flags: 0,
            epoch: 0,
            data: Bytes::from(vec![2u8; 300]),
        },
        Request::Read {
            path: p("/fuzz/a"),
            fileid: 9,
            idx: 0,
            off: 0,
            len: 4096,
            chunk_size: 4096,
            flags: 0,
            epoch: 0,
        },
        Request::SetSize {
            path: p("/fuzz/a"),
            size: 5000,
            grow_only: true,
            if_size: Some(100),
            stray: true,
        },
        Request::SetAttr {
            path: p("/fuzz/a"),
            attr: SetAttr {
                mode: Some(0o600),
                uid: Some(1),
                gid: None,
                atime: TimeSet::Now,
                mtime: TimeSet::At(12345),
            },
        },
        Request::RemoveEntry {
            path: p("/fuzz/a"),
            kind: RemoveKind::NotDir,
        },
        Request::RemoveChunks {
            path: p("/fuzz/a"),
            from_idx: 1,
        },
        Request::TruncateChunks {
            path: p("/fuzz/a"),
            size: 10,
            chunk_size: 4096,
        },
        Request::Readdir {
            path: p("/fuzz"),
            after: p(""),
            max: 100,
        },
        Request::ReaddirDirs {
            path: p("/fuzz"),
            after: p("a"),
            max: 10,
        },
        Request::HasChildren { path: p("/fuzz") },
        Request::RenameMove {
            old: p("/fuzz/a"),
            new: p("/fuzz/b"),
            is_dir: false,
        },
        Request::PutChunk {
            path: p("/fuzz/c"),
            idx: 0,
            meta: file,
            data: Bytes::from(vec![3u8; 64]),
        },
        Request::AppendReserve {
            path: p("/fuzz/a"),
            len: 64,
        },
        Request::FlushStatus { prefix: p("/fuzz") },
        Request::Flush { prefix: p("/fuzz") },
        Request::Rebalance { start: true },
        Request::AdoptChunk {
            path: p("/fuzz/e"),
            idx: 2,
            meta: file,
            data: Bytes::from(vec![4u8; 64]),
        },
        Request::Lane { cpu: 0 },
        Request::ShmAttach {
            fd: 3,
            base: 0,
            len: 4096,
        },
        Request::Lookup {
            path: p("/fuzz/a"),
            max_age_ms: 100,
        },
        Request::WatchStat {
            path: p("/fuzz/a"),
            contact: "127.0.0.1:1".into(),
            keep_ms: 100,
        },
        Request::Invalidate { path: p("/fuzz/a") },
    ]
}

/// Flips, overwrites, cuts, extends: some mutations of `b`; length-like
/// fields get extreme values.
fn mutate(r: &mut Rng, mut b: Vec<u8>) -> Vec<u8> {
    const WORDS: [u64; 6] = [0, 1, 0x7fff_ffff, 0xffff_ffff, u64::MAX, 1 << 40];
    for _ in 0..1 + r.below(4) {
        let n = b.len();
        match r.below(6) {
            0 if n > 0 => {
                let i = r.below(n);
                b[i] ^= 1 << r.below(8);
            }
            1 if n > 0 => {
                let i = r.below(n);
                b[i] = r.next() as u8;
            }
            2 => b.truncate(r.below(n + 1)),
            3 => {
                let extra = r.below(64);
                b.extend(r.bytes(extra));
            }
            4 if n >= 4 => {
                let i = r.below(n - 3);
                let w = WORDS[r.below(WORDS.len())] as u32;
                b[i..i + 4].copy_from_slice(&w.to_le_bytes());
            }
            5 if n >= 8 => {
                let i = r.below(n - 7);
                let w = WORDS[r.below(WORDS.len())];
                b[i..i + 8].copy_from_slice(&w.to_le_bytes());
            }
            _ => {}
        }
    }
    b
}

fn frame(id: u64, opcode: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Header {
        len: payload.len() as u32,
        id,
        op: opcode,
        flags,
    }
    .encode()
    .to_vec();
    f.extend_from_slice(payload);
    f
}

/// A frame as an attacker would make it: a valid request (possibly
/// mutated, possibly under another opcode) or random bytes, with random
/// flags now and then.
fn random_frame(r: &mut Rng, corpus: &[Request], id: u64) -> Vec<u8> {
    let req = &corpus[r.below(corpus.len())];
    let mut opcode = req.op();
    let payload = if r.chance(70) {
        let mut p = Vec::new();
        req.encode(&mut p);
        if r.chance(60) {
            p = mutate(r, p);
        }
        if r.chance(10) {
            opcode = r.below(40) as u16;
        }
        p
    } else {
        opcode = r.below(40) as u16;
        let n = r.below(600);
        r.bytes(n)
    };
    let flags = match r.below(20) {
        0 => FLAG_CMA,
        1 => FLAG_FORWARDED,
        2 => r.next() as u16,
        _ => 0,
    };
    frame(id, opcode, flags, &payload)
}

/// Reads until the server closes; panics if it sends a frame (nothing may
/// be served without a handshake) or keeps the connection past a timeout.
fn expect_closed(s: &mut Conn, what: &str) {
    s.end_input();
    let mut b = [0u8; 4096];
    let mut got = 0;
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{what}: the server kept the connection open: {e}"),
        }
    }
    assert!(got <= 4096, "{what}: {got} bytes after a refused handshake");
}

/// One connection without the key (`transcript`: a real client's hello
/// and proof, to replay).
fn unauthenticated(r: &mut Rng, s: &mut Conn, transcript: &[u8], corpus: &[Request]) {
    let role = [Role::Client, Role::Server, Role::Admin][r.below(3)];
    let hello = Hello {
        version: PROTOCOL_VERSION,
        role,
        has_key: true,
        nonce: r.bytes(NONCE_LEN).try_into().unwrap(),
    }
    .encode()
    .to_vec();
    let kind = r.below(5);
    let what = format!("attack {kind} as {role}");
    let _ = match kind {
        // Random bytes.
        0 => {
            let n = r.below(2048);
            s.write_all(&r.bytes(n))
        }
        // Frames without a handshake.
        1 => (0..1 + r.below(8)).try_for_each(|i| s.write_all(&random_frame(r, corpus, i as u64))),
        // A mutated hello, whatever follows.
        2 => {
            let h = mutate(r, hello);
            s.write_all(&h).and_then(|_| {
                let n = r.below(200);
                s.write_all(&r.bytes(n))
            })
        }
        // A valid hello, then a wrong proof and frames.
        3 => {
            s.write_all(&hello).unwrap();
            let (_, status, _, auth) = read_hello_reply(s).expect("a reply to a valid hello");
            assert_eq!(status, 0, "{what}");
            assert!(matches!(auth, Auth::Challenge { .. }), "{what}");
            let proof = if r.chance(50) {
                r.bytes(32)
            } else {
                mutate(r, transcript[Hello::LEN..].to_vec())
            };
            if s.write_all(&proof).is_ok() && proof.len() == 32 {
                let (v, _) = read_verdict(s).expect("a verdict");
                assert_ne!(v, 0, "{what}: a wrong proof was accepted");
            }
            (0..r.below(4)).try_for_each(|i| s.write_all(&random_frame(r, corpus, i as u64)))
        }
        // A replayed transcript of a real client.
        _ => {
            s.write_all(&transcript[..Hello::LEN]).unwrap();
            let (_, status, ..) = read_hello_reply(s).expect("a reply to a replayed hello");
            assert_eq!(status, 0, "{what}");
            s.write_all(&transcript[Hello::LEN..]).unwrap();
            let (v, _) = read_verdict(s).expect("a verdict");
            assert_ne!(v, 0, "a replayed transcript was accepted");
            s.write_all(&random_frame(r, corpus, 1))
        }
    };
    expect_closed(s, &what);
}

/// One connection with the client key: a burst of frames, replies read
/// on another thread and checked to be well formed. Returns the frames
/// sent.
fn authenticated(r: &mut Rng, mut s: Conn, key: &[u8], corpus: &[Request]) -> u64 {
    let (status, msg) = handshake(&mut s, key);
    assert_eq!(status, 0, "{msg}");
    let mut rd = s.try_clone();
    let reader = std::thread::spawn(move || {
        let mut replies = 0u64;
        loop {
            let mut hb = [0u8; HEADER_LEN];
            match rd.read_exact(&mut hb) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return replies,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return replies,
                Err(e) => panic!("reply after {replies}: {e}"),
            }
            let h = Header::decode(&hb).expect("a well-formed reply header");
            let mut p = vec![0u8; h.len as usize];
            rd.read_exact(&mut p).expect("a whole reply");
            let p = Bytes::from(p);
            if h.flags & FLAG_ERROR != 0 {
                decode_error(p).expect("a well-formed error reply");
            } else {
                Response::decode(p).expect("a well-formed reply");
            }
            replies += 1;
        }
    });
    let mut sent = 0;
    for id in 0..1 + r.below(200) as u64 {
        let f = if r.chance(1) {
            // Too large: the server closes the connection.
            Header {
                len: MAX_PAYLOAD + 1,
                id,
                op: op::WRITE,
                flags: 0,
            }
            .encode()
            .to_vec()
        } else {
            random_frame(r, corpus, id)
        };
        if s.write_all(&f).is_err() {
            break;
        }
        sent += 1;
    }
    s.end_input();
    reader.join().expect("replies well formed");
    sent
}

fn canary_path(i: usize, tag: u64) -> String {
    format!("/canary-{tag:016x}-{i}")
}

fn canary_bytes(i: usize, tag: u64) -> Bytes {
    let mut r = Rng(tag ^ i as u64);
    Bytes::from(r.bytes(CANARY_LEN))
}

fn canary_meta() -> Meta {
    Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: CANARY_LEN as u32,
        fileid: 77,
        ..Default::default()
    }
}

fn read_canary(addr: &str, key: &[u8], path: &str) -> Result<Response, (i32, String)> {
    let mut s = Conn::open(addr, false);
    let (st, msg) = handshake(&mut s, key);
    assert_eq!(st, 0, "{msg}");
    let mut req = whole_chunk0(path, CANARY_LEN as u32);
    if let Request::Read { fileid, .. } = &mut req {
        *fileid = canary_meta().fileid;
    }
    call(&mut s, 1, &req)
}

fn no_panics_logged(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            assert!(
                !text.contains("panicked"),
                "{}: a server panicked:\n{text}",
                e.path().display()
            );
        }
    }
}

/// Runs `work` on [`THREADS`] threads for `secs`, each with its own
/// generator; returns the sum of what they return.
fn run_threads(seed: u64, secs: f64, work: impl Fn(&mut Rng) -> u64 + Sync) -> u64 {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let work = &work;
                sc.spawn(move || {
                    let mut r = Rng(seed.wrapping_mul(31).wrapping_add(t));
                    let mut n = 0;
                    while Instant::now() < end {
                        n += work(&mut r);
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

#[test]
fn random_and_mutated_frames_with_and_without_the_key_change_nothing_they_may_not() {
    let secs: f64 = std::env::var("CHFS_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    let seed: u64 = std::env::var("CHFS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("CHFS_FUZZ_SEED={seed} CHFS_FUZZ_SECS={secs}");
    // DRAM stores of a bounded size: random writes fill them to ENOSPC at
    // most.
    let p = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            args: vec!["--size".into(), "64M".into()],
            store: Some("mem".into()),
            chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
            ..Default::default()
        }
        .with_new_secret(),
    )
    .unwrap();
    let addrs = p.addrs().to_vec();
    let key = std::fs::read(p.client_key_file().unwrap()).unwrap();
    let tag = seed | 1;
    for i in 0..CANARIES {
        let mut s = Conn::open(&addrs[i % addrs.len()], false);
        assert_eq!(handshake(&mut s, &key).0, 0);
        let r = call(
            &mut s,
            1,
            &Request::Create {
                path: canary_path(i, tag),
                meta: canary_meta(),
                excl: true,
                data: canary_bytes(i, tag),
            },
        );
        assert!(r.is_ok(), "{r:?}");
    }
    // A real client's transcript, to replay.
    let transcript = {
        let mut s = Conn::open(&addrs[0], false);
        let mut rec = Recorder {
            inner: &mut s,
            sent: Vec::new(),
        };
        assert_eq!(handshake(&mut rec, &key).0, 0);
        assert_eq!(rec.sent.len(), Hello::LEN + 32);
        rec.sent
    };
    let pids: Vec<u32> = (0..addrs.len()).map(|i| p.pid(i).unwrap()).collect();
    let rss = |i: usize| rss_kib(pids[i]);
    let rss0: Vec<u64> = (0..addrs.len()).map(rss).collect();
    assert!(rss0.iter().all(|&k| k > 0), "VmRSS unreadable: {rss0:?}");
    let before: Vec<(u64, u64)> = addrs
        .iter()
        .map(|a| {
            let st = status_with(a, &key);
            (st.entries, st.bytes)
        })
        .collect();
    let corpus = corpus();

    // 1. Without the key.
    let n = run_threads(seed, secs, |r| {
        let addr = &addrs[r.below(addrs.len())];
        let mut s = Conn::open(addr, r.chance(50));
        unauthenticated(r, &mut s, &transcript, &corpus);
        1
    });
    let after: Vec<(u64, u64)> = addrs
        .iter()
        .map(|a| {
            let st = status_with(a, &key);
            assert!(st.refused > 0, "{a}: no handshake counted as refused");
            (st.entries, st.bytes)
        })
        .collect();
    assert_eq!(
        before, after,
        "{n} connections without the key changed the store (entries, bytes)"
    );
    eprintln!("{n} connections without the key: all refused, nothing changed");

    // 2. With the client key.
    let frames = run_threads(seed ^ 0x5555, secs, |r| {
        let addr = &addrs[r.below(addrs.len())];
        let s = Conn::open(addr, r.chance(50));
        authenticated(r, s, &key, &corpus)
    });
    eprintln!("{frames} frames with the client key");

    for (i, a) in addrs.iter().enumerate() {
        // SAFETY: kill with signal 0 only checks that the process exists.
        assert_eq!(unsafe { libc::kill(pids[i] as i32, 0) }, 0, "{a} died");
        let st = status_with(a, &key);
        assert!(st.denied > 0, "{a}: no request denied to the client key");
        let grown = rss(i).saturating_sub(rss0[i]);
        assert!(
            grown < 256 << 10,
            "{a}: grew by {grown} KiB ({} entries, {} bytes stored)",
            st.entries,
            st.bytes
        );
        eprintln!(
            "{a}: grew by {grown} KiB, {} entries, {} bytes, {} denied",
            st.entries, st.bytes, st.denied
        );
    }
    for i in 0..CANARIES {
        let path = canary_path(i, tag);
        for a in &addrs {
            assert_eq!(
                read_canary(a, &key, &path),
                Ok(Response::Data(canary_bytes(i, tag))),
                "{path} through {a}"
            );
        }
    }
    no_panics_logged(p.log_dir());
}
