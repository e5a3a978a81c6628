//! Endpoints over libfabric's tcp (under ofi_rxm) and shm providers, in
//! threads and in separate processes: messages, RMA, the registration
//! cache, dead peers, idle cost, bad input.
//!
//! Needs libfabric (the `fabric` capability of `CHFS_TEST_REQUIRE`, set by
//! scripts/test.sh where pkg-config finds it): without it each test says
//! it was skipped, or fails when the capability is required.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chfs_fabric::{
    Address, Config, Endpoint, Error, Local, Peer, Protocol, RemoteKey, WaitKind,
    BUILT_WITH_LIBFABRIC,
};

const T: Duration = Duration::from_secs(10);

fn config(protocol: Protocol) -> Config {
    let c = Config::new(protocol);
    if protocol == Protocol::Tcp {
        c.bind("127.0.0.1", None)
    } else {
        c
    }
}

/// An endpoint, or None (and a skip) where this build has no libfabric.
fn open(test: &str, cfg: &Config) -> Option<Endpoint> {
    if !BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric (libfabric-dev)");
        return None;
    }
    Some(Endpoint::open(cfg).unwrap_or_else(|e| panic!("{test}: opening {cfg:?}: {e}")))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// The server side of a ping-pong: the client names itself in its first
/// message (rxm does not report senders), then each of `rounds`
/// messages is answered with its bytes (reversed if `reverse`).
fn echo(server: &Endpoint, rounds: usize, reverse: bool) {
    let hello = server.recv(T).unwrap();
    let back: Address = std::str::from_utf8(&hello).unwrap().parse().unwrap();
    drop(hello);
    let to_client = server.connect(&back).unwrap();
    for _ in 0..rounds {
        let m = server.recv(T).unwrap();
        let mut reply = m.to_vec();
        drop(m);
        if reverse {
            reply.reverse();
        }
        server.send(to_client, &reply, T).unwrap();
    }
}

/// Ping-pong between two endpoints in two threads: the client names
/// itself in its first message (rxm does not report senders), then each
/// message is answered with its bytes reversed.
fn ping_pong(protocol: Protocol, test: &str) {
    let Some(server) = open(test, &config(protocol)) else {
        return;
    };
    let Some(client) = open(test, &config(protocol)) else {
        return;
    };
    assert_eq!(server.address().protocol, protocol);
    let to_server = client.connect(server.address()).unwrap();
    let sizes = [1usize, 32, 64, 65, 4096, 4097, 60_000, client.max_message()];
    let rounds = 200;
    std::thread::scope(|s| {
        s.spawn(|| echo(&server, rounds * sizes.len(), true));
        client
            .send(to_server, client.address().to_string().as_bytes(), T)
            .unwrap();
        for round in 0..rounds {
            for (k, &len) in sizes.iter().enumerate() {
                let msg = pattern(len, (round + k) as u8);
                client.send(to_server, &msg, T).unwrap();
                let reply = client.recv(T).unwrap();
                let mut want = msg.clone();
                want.reverse();
                assert!(*reply == *want, "{test}: round {round}, {len} bytes");
            }
        }
    });
    let st = client.stats();
    assert_eq!(st.sends, 1 + (rounds * sizes.len()) as u64);
    assert_eq!(st.recvs, (rounds * sizes.len()) as u64);
}

#[test]
fn ping_pong_tcp() {
    ping_pong(Protocol::Tcp, "ping_pong_tcp");
}

#[test]
fn ping_pong_shm() {
    ping_pong(Protocol::Shm, "ping_pong_shm");
}

#[test]
fn a_message_larger_than_the_receive_buffers_is_refused() {
    let Some(a) = open("message_too_large", &config(Protocol::Tcp)) else {
        return;
    };
    let p = a.connect(a.address()).unwrap();
    let err = a.send(p, &vec![0u8; a.max_message() + 1], T).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert_eq!(err.errno(), libc::EINVAL);
}

/// A send the provider took whose completion could not be read (a
/// failed completion-queue read, injected) is reported as possibly sent
/// (`may_have_left`: callers must not send it again as if it never left),
/// and it did reach the peer; the endpoint goes on working.
fn a_send_whose_completion_is_not_learnt(protocol: Protocol, test: &str) {
    let Some(server) = open(test, &config(protocol)) else {
        return;
    };
    let Some(client) = open(test, &config(protocol)) else {
        return;
    };
    let to_server = client.connect(server.address()).unwrap();
    let len = 60_000.min(client.max_message());
    let msgs = [pattern(len, 1), pattern(len, 7), pattern(len, 8)];
    std::thread::scope(|s| {
        // The server takes what comes (and makes progress: rxm sets the
        // connection up while both sides read their queues).
        let got = s.spawn(|| {
            (0..3)
                .map(|_| server.recv(T).unwrap().to_vec())
                .collect::<Vec<_>>()
        });
        // The connection is set up by a first message (until then rxm
        // refuses sends with EAGAIN: not taken, which a fault would fail
        // as such).
        client.send(to_server, &msgs[0], T).unwrap();
        // Larger than the provider's inject size: posted, its completion
        // waited for.
        client.fail_completion_reads(1);
        let err = client.send(to_server, &msgs[1], T).unwrap_err();
        assert!(matches!(err, Error::Unsettled { op: "send", .. }), "{err}");
        assert!(err.may_have_left(), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        // The fault is spent: the next send completes.
        client.send(to_server, &msgs[2], T).unwrap();
        // The one whose outcome was unknown was sent, and whole.
        let got = got.join().unwrap();
        assert!(got == msgs, "the messages received differ");
    });
}

#[test]
fn a_send_whose_completion_is_not_learnt_may_have_left_tcp() {
    a_send_whose_completion_is_not_learnt(
        Protocol::Tcp,
        "a_send_whose_completion_is_not_learnt_may_have_left_tcp",
    );
}

#[test]
fn a_send_whose_completion_is_not_learnt_may_have_left_shm() {
    a_send_whose_completion_is_not_learnt(
        Protocol::Shm,
        "a_send_whose_completion_is_not_learnt_may_have_left_shm",
    );
}

#[test]
fn threads_share_an_endpoint() {
    let test = "threads_share_an_endpoint";
    let Some(server) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let p = client.connect(server.address()).unwrap();
    let (threads, each) = (4u32, 300u32);
    std::thread::scope(|s| {
        let server = &server;
        let counter = s.spawn(move || {
            let mut seen = vec![vec![false; each as usize]; threads as usize];
            for _ in 0..threads * each {
                let m = server.recv(T).unwrap();
                let t = u32::from_le_bytes(m[0..4].try_into().unwrap()) as usize;
                let i = u32::from_le_bytes(m[4..8].try_into().unwrap()) as usize;
                assert_eq!(m.len(), 8 + (i % 3) * 1000, "thread {t} message {i}");
                assert!(!seen[t][i], "thread {t} message {i} twice");
                seen[t][i] = true;
            }
            seen.iter().all(|s| s.iter().all(|&x| x))
        });
        for t in 0..threads {
            let client = &client;
            s.spawn(move || {
                for i in 0..each {
                    let mut m = vec![0u8; 8 + (i as usize % 3) * 1000];
                    m[0..4].copy_from_slice(&t.to_le_bytes());
                    m[4..8].copy_from_slice(&i.to_le_bytes());
                    client.send(p, &m, T).unwrap();
                }
            });
        }
        assert!(counter.join().unwrap(), "every message arrived once");
    });
    // (Threads that waited while another read the queue were woken by it:
    // none waited until its timeout, which the sends' unwraps check.)
}

/// The server thread of an RMA test: answers `window LEN SEED` with the
/// key of a new window filled with pattern(LEN, SEED), `check LEN SEED`
/// with `ok` or `bad` for the window's bytes, until `bye`.
fn rma_server(server: &Endpoint) {
    let hello = server.recv(T).unwrap();
    let back: Address = std::str::from_utf8(&hello).unwrap().parse().unwrap();
    drop(hello);
    let to_client = server.connect(&back).unwrap();
    let mut window = None;
    loop {
        let m = server.recv(T).unwrap();
        let cmd = String::from_utf8(m.to_vec()).unwrap();
        drop(m);
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words[..] {
            ["window", len, seed] => {
                let len: usize = len.parse().unwrap();
                let w = server.window(len).unwrap();
                w.copy_in(0, &pattern(len, seed.parse().unwrap())).unwrap();
                server.send(to_client, &w.remote_key().encode(), T).unwrap();
                window = Some(w);
            }
            ["check", len, seed] => {
                let len: usize = len.parse().unwrap();
                let mut got = vec![0u8; len];
                window.as_ref().unwrap().copy_out(0, &mut got).unwrap();
                let ok = got == pattern(len, seed.parse().unwrap());
                server
                    .send(to_client, if ok { b"ok" } else { b"bad" }, T)
                    .unwrap();
            }
            ["bye"] => return,
            _ => panic!("unknown command {cmd:?}"),
        }
    }
}

fn ask(client: &Endpoint, p: Peer, cmd: &str) -> Vec<u8> {
    client.send(p, cmd.as_bytes(), T).unwrap();
    client.recv(T).unwrap().to_vec()
}

fn rma(protocol: Protocol, test: &str) {
    let Some(server) = open(test, &config(protocol)) else {
        return;
    };
    let Some(client) = open(test, &config(protocol)) else {
        return;
    };
    let p = client.connect(server.address()).unwrap();
    const MIB: usize = 1 << 20;
    std::thread::scope(|s| {
        s.spawn(|| rma_server(&server));
        client
            .send(p, client.address().to_string().as_bytes(), T)
            .unwrap();
        let key = RemoteKey::decode(&ask(&client, p, &format!("window {MIB} 1"))).unwrap();
        assert_eq!(key.len, MIB as u64);
        // Read the window's 1 MiB.
        let buf = client.buffer(MIB).unwrap();
        let buf = client
            .read(p, Local::Buffer(buf), 0, MIB, key, 0, T)
            .unwrap()
            .unwrap();
        assert!(*buf == *pattern(MIB, 1), "{test}: RMA read of 1 MiB");
        // A part of it, at offsets on both sides.
        let buf = client
            .read(p, Local::Buffer(buf), 100, 5000, key, 777, T)
            .unwrap()
            .unwrap();
        assert_eq!(&buf[100..5100], &pattern(MIB, 1)[777..5777]);
        // Write 1 MiB into it; the server checks.
        let mut buf = buf;
        buf.copy_from_slice(&pattern(MIB, 2));
        let buf = client
            .write(p, Local::Buffer(buf), 0, MIB, key, 0, T)
            .unwrap();
        assert!(buf.is_some(), "the buffer comes back");
        assert_eq!(ask(&client, p, &format!("check {MIB} 2")), b"ok");
        // Out of the window's range: refused before anything is sent.
        let b = client.buffer(16).unwrap();
        let err = client
            .read(p, Local::Buffer(b), 0, 16, key, MIB as u64 - 8, T)
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err}");
        client.send(p, b"bye", T).unwrap();
    });
    assert_eq!(client.stats().reads, 2);
    assert_eq!(client.stats().writes, 1);
}

#[test]
fn rma_write_and_read_1mib_tcp() {
    rma(Protocol::Tcp, "rma_write_and_read_1mib_tcp");
}

#[test]
fn rma_write_and_read_1mib_shm() {
    rma(Protocol::Shm, "rma_write_and_read_1mib_shm");
}

#[test]
fn registration_cache_hits_and_evicts() {
    let test = "registration_cache_hits_and_evicts";
    let mut cfg = config(Protocol::Tcp);
    cfg.cache_limit = 3 << 20;
    let Some(server) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let Some(client) = open(test, &cfg) else {
        return;
    };
    let p = client.connect(server.address()).unwrap();
    const MIB: usize = 1 << 20;
    let chunk = bytes::Bytes::from(pattern(MIB, 3));
    let first = client.register(chunk.clone()).unwrap();
    let st = client.stats().cache;
    assert_eq!((st.hits, st.misses, st.entries), (0, 1, 1));
    // The same memory again, and a slice of it: hits, no new registration.
    let again = client.register(chunk.clone()).unwrap();
    assert!(Arc::ptr_eq(&first.pinned, &again.pinned));
    let part = client.register(chunk.slice(4096..8192)).unwrap();
    assert!(Arc::ptr_eq(&first.pinned, &part.pinned));
    assert_eq!((part.off, part.len), (4096, 4096));
    assert_eq!(part.bytes(), &chunk[4096..8192]);
    let st = client.stats().cache;
    assert_eq!(
        (st.hits, st.misses, st.entries, st.bytes),
        (2, 1, 1, MIB as u64)
    );
    // Writing from it uses the cached registration, and the data lands.
    std::thread::scope(|s| {
        s.spawn(|| rma_server(&server));
        client
            .send(p, client.address().to_string().as_bytes(), T)
            .unwrap();
        let key = RemoteKey::decode(&ask(&client, p, &format!("window {MIB} 0"))).unwrap();
        client.write_from(p, chunk.clone(), key, 0, T).unwrap();
        assert_eq!(ask(&client, p, &format!("check {MIB} 3")), b"ok");
        client.send(p, b"bye", T).unwrap();
    });
    let st = client.stats();
    assert_eq!((st.cache.hits, st.cache.misses), (3, 1));
    assert_eq!(st.reg_fallbacks, 0);
    // Three more megabytes: the least recently used entries go.
    let others: Vec<bytes::Bytes> = (0..3)
        .map(|i| bytes::Bytes::from(pattern(MIB, i)))
        .collect();
    for o in &others {
        client.register(o.clone()).unwrap();
    }
    let st = client.stats().cache;
    assert!(st.evictions >= 1, "{st:?}");
    assert!(st.bytes <= 3 << 20, "{st:?}");
    assert_eq!(st.misses, 4);
    // The first chunk's entry went first (least recently used): a miss.
    client.register(chunk.clone()).unwrap();
    assert_eq!(client.stats().cache.misses, 5);
    // A hit makes an entry the most recently used: of the three cached
    // now (others[1], others[2], chunk), others[1] is used again, so a new
    // one evicts others[2], not it.
    client.register(others[1].clone()).unwrap();
    assert_eq!(client.stats().cache.misses, 5);
    client
        .register(bytes::Bytes::from(pattern(MIB, 9)))
        .unwrap();
    assert_eq!(client.stats().cache.misses, 6);
    client.register(others[1].clone()).unwrap();
    assert_eq!(client.stats().cache.misses, 6, "the entry used last stayed");
    client.register(others[2].clone()).unwrap();
    assert_eq!(
        client.stats().cache.misses,
        7,
        "the least recently used went"
    );
    let st = client.stats().cache;
    assert!(st.bytes <= 3 << 20 && st.entries <= 3, "{st:?}");
}

#[test]
fn recv_with_nothing_to_receive_times_out() {
    let Some(a) = open("recv_times_out", &config(Protocol::Tcp)) else {
        return;
    };
    let t0 = Instant::now();
    let err = a
        .recv(Duration::from_millis(300))
        .err()
        .expect("nothing was sent");
    let took = t0.elapsed();
    assert!(matches!(err, Error::Timeout { op: "recv", .. }), "{err}");
    assert_eq!(err.errno(), libc::ETIMEDOUT);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn idle_cpu(protocol: Protocol, test: &str, max_share: f64) {
    let Some(a) = open(test, &config(protocol)) else {
        return;
    };
    let Some(b) = open(test, &config(protocol)) else {
        return;
    };
    // A peer connected and used, then quiet: the waiting endpoint keeps
    // its connection and waits on it. (The receiver must be progressing
    // while the first message goes: rxm sets up its connection then.)
    let p = b.connect(a.address()).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| drop(a.recv(T).unwrap()));
        b.send(p, b"wake", T).unwrap();
    });
    let idle = Duration::from_secs(2);
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    assert!(matches!(a.recv(idle), Err(Error::Timeout { .. })));
    let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    assert!(
        share < max_share,
        "{test}: waiting {wall:?} cost {cpu:?} of CPU ({:.2}%, wait {:?})",
        share * 100.0,
        a.wait_kind()
    );
}

#[test]
fn an_idle_tcp_endpoint_sleeps() {
    idle_cpu(Protocol::Tcp, "an_idle_tcp_endpoint_sleeps", 0.01);
}

#[test]
fn an_idle_shm_endpoint_costs_little() {
    // shm has no wait object in libfabric 1.17: the waiter reads the queue
    // every 2 ms.
    idle_cpu(Protocol::Shm, "an_idle_shm_endpoint_costs_little", 0.05);
}

#[test]
fn the_tcp_provider_has_a_wait_descriptor() {
    let Some(a) = open("wait_descriptor", &config(Protocol::Tcp)) else {
        return;
    };
    assert_eq!(a.wait_kind(), WaitKind::Fd);
    assert_eq!(a.attr().provider, "tcp;ofi_rxm");
    assert_eq!(a.attr().domain, "lo");
}

#[test]
fn a_provider_that_is_not_here_is_unavailable() {
    // cxi (Slingshot), efa and psm3 are not in Debian's libfabric, and no
    // build without libfabric has any provider.
    for protocol in [Protocol::Cxi, Protocol::Efa, Protocol::Psm3] {
        let err = Endpoint::open(&Config::new(protocol)).unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        let text = err.to_string();
        assert!(text.contains(protocol.provider()), "{text}");
        if !BUILT_WITH_LIBFABRIC {
            assert!(text.contains("libfabric-dev"), "{text}");
        }
        assert_eq!(err.errno(), libc::EPROTONOSUPPORT);
    }
}

#[test]
fn a_tcp_endpoint_binds_the_port_it_is_given() {
    let test = "a_tcp_endpoint_binds_the_port_it_is_given";
    if !BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric (libfabric-dev)");
        return;
    }
    // A port free a moment ago (as chfsd --host HOST:PORT will give one).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = Config::new(Protocol::Tcp).bind("127.0.0.1", Some(&port.to_string()));
    let Some(server) = open(test, &cfg) else {
        return;
    };
    assert_eq!(
        server.address().to_string(),
        format!("ofi+tcp://127.0.0.1:{port}")
    );
    // A client reaches it through the written address alone.
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let written: Address = format!("ofi+tcp://127.0.0.1:{port}").parse().unwrap();
    let p = client.connect(&written).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(&*server.recv(T).unwrap(), b"by the book"));
        client.send(p, b"by the book", T).unwrap();
    });
    // The port is taken now: a second endpoint on it fails clearly.
    let err = Endpoint::open(&cfg).unwrap_err();
    assert_eq!(err.errno(), libc::EADDRINUSE, "{err}");
}

#[test]
fn bad_addresses_are_refused_clearly() {
    let Some(a) = open("bad_addresses", &config(Protocol::Tcp)) else {
        return;
    };
    // Another protocol's address.
    let shm: Address = "ofi+shm://x666f6f00".parse().unwrap();
    let err = a.connect(&shm).unwrap_err();
    assert!(matches!(err, Error::BadAddress { .. }), "{err}");
    assert!(err.to_string().contains("speaks ofi+tcp"), "{err}");
    // A raw name of the wrong length for the provider.
    let short: Address = "ofi+tcp://x0200".parse().unwrap();
    let err = a.connect(&short).unwrap_err();
    assert!(matches!(err, Error::BadAddress { .. }), "{err}");
    assert!(err.to_string().contains("2-byte address"), "{err}");
    // Malformed strings never reach libfabric.
    for s in [
        "ofi+tcp:/127.0.0.1:1",
        "ofi+tcp://127.0.0.1:",
        "ofi+tcp://x0g",
    ] {
        let err = s.parse::<Address>().unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL, "{s}: {err}");
    }
}

#[test]
fn a_peer_that_never_existed_fails_in_time() {
    let Some(a) = open("peer_never_existed", &config(Protocol::Tcp)) else {
        return;
    };
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let nobody: Address = format!("ofi+tcp://127.0.0.1:{port}").parse().unwrap();
    let p = a.connect(&nobody).unwrap();
    let t0 = Instant::now();
    let timeout = Duration::from_secs(3);
    // Larger than the inject size, so the send has a completion to fail.
    let err = a.send(p, &[1u8; 1000], timeout).unwrap_err();
    assert!(
        t0.elapsed() < timeout + Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    assert!(err.is_peer_failure(), "{err}");
}

/// The child process of the cross-process tests: a server that prints
/// its address, then serves [`rma_server`]'s commands plus `echo`.
#[test]
#[ignore = "run as a child process by the cross-process tests"]
fn child_server() {
    let server = Endpoint::open(&config(Protocol::Tcp)).unwrap();
    println!("ADDRESS {}", server.address());
    std::io::stdout().flush().unwrap();
    rma_server(&server);
}

struct ChildServer {
    child: Child,
    address: Address,
    /// Its output: kept open (a closed pipe would fail the child's last
    /// words) and drained at the end.
    out: BufReader<std::process::ChildStdout>,
}

impl ChildServer {
    fn start() -> ChildServer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_server",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        let mut lines = BufReader::new(out);
        // libtest may print "test child_server ... " before it on the line.
        let at = loop {
            line.clear();
            assert!(
                lines.read_line(&mut line).unwrap() > 0,
                "the child said no address"
            );
            if let Some(at) = line.find("ADDRESS ") {
                break at;
            }
        };
        let address = line[at + "ADDRESS ".len()..].trim().parse().unwrap();
        ChildServer {
            child,
            address,
            out: lines,
        }
    }

    /// Waits for the child to exit by itself; its success.
    fn wait(&mut self) -> bool {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut self.out, &mut rest);
        self.child.wait().unwrap().success()
    }

    fn kill(&mut self) {
        // SAFETY: kill(2) of our own child, by its PID.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

#[test]
fn rma_with_a_server_in_another_process() {
    let test = "rma_with_a_server_in_another_process";
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let mut child = ChildServer::start();
    let p = client.connect(&child.address).unwrap();
    client
        .send(p, client.address().to_string().as_bytes(), T)
        .unwrap();
    const LEN: usize = 4 << 20;
    let key = RemoteKey::decode(&ask(&client, p, &format!("window {LEN} 9"))).unwrap();
    let buf = client.buffer(LEN).unwrap();
    let mut buf = client
        .read(p, Local::Buffer(buf), 0, LEN, key, 0, T)
        .unwrap()
        .unwrap();
    assert!(*buf == *pattern(LEN, 9));
    buf.copy_from_slice(&pattern(LEN, 10));
    client
        .write(p, Local::Buffer(buf), 0, LEN, key, 0, T)
        .unwrap();
    assert_eq!(ask(&client, p, &format!("check {LEN} 10")), b"ok");
    client.send(p, b"bye", T).unwrap();
    assert!(child.wait(), "the child server ended well");
}

#[test]
fn a_peer_that_dies_mid_transfer_fails_in_time() {
    let test = "a_peer_that_dies_mid_transfer_fails_in_time";
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let mut child = ChildServer::start();
    let p = client.connect(&child.address).unwrap();
    client
        .send(p, client.address().to_string().as_bytes(), T)
        .unwrap();
    const LEN: usize = 16 << 20;
    let key = RemoteKey::decode(&ask(&client, p, &format!("window {LEN} 4"))).unwrap();
    let timeout = Duration::from_secs(3);
    // The kill lands while reads go on back to back, after the first
    // completed (on a loaded machine one may take long).
    let completed = AtomicUsize::new(0);
    let ((err, took), done, killed_at) = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            while completed.load(Ordering::Acquire) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(20));
            child.kill();
            Instant::now()
        });
        // Reads of 16 MiB back to back until one fails.
        let mut buf = client.buffer(LEN).unwrap();
        let mut done = 0;
        let err = loop {
            let t0 = Instant::now();
            match client.read(p, Local::Buffer(buf), 0, LEN, key, 0, timeout) {
                Ok(b) => {
                    buf = b.unwrap();
                    done += 1;
                    completed.store(done, Ordering::Release);
                    assert!(done < 100_000, "reads went on after the peer was killed");
                }
                Err(e) => break (e, t0.elapsed()),
            }
        };
        (err, done, killer.join().unwrap())
    });
    let late = killed_at.elapsed();
    assert!(done >= 1, "some reads completed before the kill");
    assert!(err.is_peer_failure(), "{err}");
    assert!(
        late < timeout + Duration::from_secs(2),
        "the error came {late:?} after the kill"
    );
    eprintln!("{test}: {done} reads of 16 MiB, then after {took:?}: {err}");
    // The next operation to the dead peer fails too, in time.
    let t0 = Instant::now();
    let err = client.send(p, &[0u8; 1000], timeout).unwrap_err();
    assert!(err.is_peer_failure(), "{err}");
    assert!(
        t0.elapsed() < timeout + Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    eprintln!("{test}: then a send: {err}");
}

/// Memory exposed for a call can be read by the peer during the call;
/// after it, tcp refuses the peer (the key is gone) while libfabric
/// 1.17's shm does not check keys at all (it copies with
/// `process_vm_readv` at the address): the RPC layer must not rely on
/// revocation there (doc/fabric.md).
fn exposure_ends_with_the_call(protocol: Protocol, test: &str, refused_after: bool, lend: bool) {
    let Some(server) = open(test, &config(protocol)) else {
        return;
    };
    let Some(client) = open(test, &config(protocol)) else {
        return;
    };
    let p = client.connect(server.address()).unwrap();
    const LEN: usize = 64 * 1024;
    let data = pattern(LEN, 77);
    let server_done = AtomicBool::new(false);
    let after = std::thread::scope(|s| {
        let server_side = s.spawn(|| {
            let hello = server.recv(T).unwrap();
            let back: Address = std::str::from_utf8(&hello).unwrap().parse().unwrap();
            drop(hello);
            let to_client = server.connect(&back).unwrap();
            let key = RemoteKey::decode(&server.recv(T).unwrap()).unwrap();
            let b = server.buffer(LEN).unwrap();
            let b = server
                .read(to_client, Local::Buffer(b), 0, LEN, key, 0, T)
                .unwrap()
                .unwrap();
            let ok = *b == *pattern(LEN, 77);
            server
                .send(to_client, if ok { b"ok" } else { b"bad" }, T)
                .unwrap();
            assert_eq!(&*server.recv(T).unwrap(), b"again");
            let b = server.buffer(LEN).unwrap();
            let r = server.read(
                to_client,
                Local::Buffer(b),
                0,
                LEN,
                key,
                0,
                Duration::from_secs(3),
            );
            server_done.store(true, Ordering::Release);
            r.map(|b| *b.unwrap() == *pattern(LEN, 77))
        });
        client
            .send(p, client.address().to_string().as_bytes(), T)
            .unwrap();
        let call = |key: RemoteKey| {
            client.send(p, &key.encode(), T).unwrap();
            client.recv(T).unwrap().to_vec()
        };
        let during = if lend {
            // Lent (as a request in flight holds the caller's memory),
            // then the lending ends.
            // SAFETY: dropped below, before `data` is touched again.
            let lent = unsafe { client.lend(&data) }.unwrap();
            let got = call(lent.remote_key());
            drop(lent);
            got
        } else {
            client.expose(&data, call).unwrap()
        };
        assert_eq!(during, b"ok", "{test}: the peer read the exposed memory");
        client.send(p, b"again", T).unwrap();
        // The server's second read needs this side's progress (tcp).
        let until = Instant::now() + T;
        while !server_done.load(Ordering::Acquire) && Instant::now() < until {
            client.progress(Duration::from_millis(50)).unwrap();
        }
        server_side.join().unwrap()
    });
    if refused_after {
        let err = after.expect_err("a read of memory no longer exposed");
        assert!(err.is_peer_failure(), "{test}: {err}");
    } else {
        assert!(after.unwrap(), "{test}: shm read the memory after the call");
    }
}

#[test]
fn exposure_ends_with_the_call_tcp() {
    exposure_ends_with_the_call(
        Protocol::Tcp,
        "exposure_ends_with_the_call_tcp",
        true,
        false,
    );
}

#[test]
fn exposure_is_not_revoked_on_shm() {
    exposure_ends_with_the_call(
        Protocol::Shm,
        "exposure_is_not_revoked_on_shm",
        false,
        false,
    );
}

#[test]
fn lent_memory_is_refused_after_the_lending_ends_tcp() {
    exposure_ends_with_the_call(
        Protocol::Tcp,
        "lent_memory_is_refused_after_the_lending_ends_tcp",
        true,
        true,
    );
}

/// Memory lent for writes receives the peer's RMA write while lent; once
/// the lending ended, tcp refuses the peer's write with the same key and
/// the memory keeps what it had (a late write of a request the caller gave
/// up on cannot reach memory it has taken back). The refusal is the
/// target's: tcp completes an RMA write at its initiator once sent, so the
/// peer may not learn of it; a message sent after it, on the same
/// connection, tells when the target has dealt with it.
#[test]
fn memory_lent_for_writes_is_refused_after_the_lending_ends_tcp() {
    let test = "memory_lent_for_writes_is_refused_after_the_lending_ends_tcp";
    let Some(server) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let p = client.connect(server.address()).unwrap();
    const LEN: usize = 256 * 1024;
    let mut dst = vec![0u8; LEN];
    let server_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server_side = s.spawn(|| {
            let hello = server.recv(T).unwrap();
            let back: Address = std::str::from_utf8(&hello).unwrap().parse().unwrap();
            drop(hello);
            let to_client = server.connect(&back).unwrap();
            let key = RemoteKey::decode(&server.recv(T).unwrap()).unwrap();
            let mut b = server.buffer(LEN).unwrap();
            b.copy_from_slice(&pattern(LEN, 5));
            server
                .write(to_client, Local::Buffer(b), 0, LEN, key, 0, T)
                .unwrap();
            server.send(to_client, b"written", T).unwrap();
            assert_eq!(&*server.recv(T).unwrap(), b"again");
            let mut b = server.buffer(LEN).unwrap();
            b.copy_from_slice(&pattern(LEN, 6));
            let r = server.write(
                to_client,
                Local::Buffer(b),
                0,
                LEN,
                key,
                0,
                Duration::from_secs(3),
            );
            if let Err(e) = &r {
                assert!(e.is_peer_failure(), "{e}");
            }
            // After the write, on the same connection.
            let sent = server.send(to_client, b"after", T);
            server_done.store(true, Ordering::Release);
            sent
        });
        client
            .send(p, client.address().to_string().as_bytes(), T)
            .unwrap();
        // SAFETY: dropped below, before `dst` is read.
        let lent = unsafe { client.lend_mut(&mut dst) }
            .map_err(|(e, _)| e)
            .unwrap();
        client.send(p, &lent.remote_key().encode(), T).unwrap();
        assert_eq!(&*client.recv(T).unwrap(), b"written");
        drop(lent);
        client.send(p, b"again", T).unwrap();
        // Until the message after the refused write came (the write was
        // dealt with first), or the connection broke over it (tcp 1.17's
        // does: nothing more comes).
        let got = client.recv(Duration::from_secs(3)).map(|m| m.to_vec());
        let sent = server_side.join().unwrap();
        eprintln!("{test}: server's message after: {sent:?}, received: {got:?}");
        if let (Ok(()), Ok(m)) = (&sent, &got) {
            assert_eq!(m, b"after");
        }
        assert!(server_done.load(Ordering::Acquire));
    });
    assert!(
        dst == pattern(LEN, 5),
        "a write after the lending ended landed"
    );
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Polls `futs` on this thread until all are ready (a waker that unparks
/// it), within `T`.
fn block_on_all<F: std::future::Future + Unpin>(mut futs: Vec<F>) -> Vec<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    let deadline = Instant::now() + T;
    loop {
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let std::task::Poll::Ready(v) = std::pin::Pin::new(f).poll(&mut cx) {
                    *o = Some(v);
                }
            }
        }
        if out.iter().all(Option::is_some) {
            return out.into_iter().map(Option::unwrap).collect();
        }
        assert!(
            Instant::now() < deadline,
            "operations still in flight after {T:?}"
        );
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

/// RMA started by one thread and completed by another that reads the
/// queue (a server's progress thread): the futures wake when their
/// completions are filed; an abandoned one costs nothing later.
#[test]
fn started_rma_completes_through_a_progress_thread() {
    let test = "started_rma_completes_through_a_progress_thread";
    let Some(server) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let Some(client) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let client = Arc::new(client);
    let p = client.connect(server.address()).unwrap();
    const MIB: usize = 1 << 20;
    std::thread::scope(|s| {
        s.spawn(|| rma_server(&server));
        client
            .send(p, client.address().to_string().as_bytes(), T)
            .unwrap();
        let key = RemoteKey::decode(&ask(&client, p, &format!("window {} 5", 4 * MIB))).unwrap();
        let stop = AtomicBool::new(false);
        let whole = pattern(4 * MIB, 5);
        std::thread::scope(|inner| {
            // Stops the progress thread however this scope ends (a
            // failed assertion included), so the test cannot hang.
            let _stop = StopOnDrop(&stop);
            inner.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    client.progress(Duration::from_millis(20)).unwrap();
                }
            });
            // One read abandoned at once, then four at once, each 1 MiB.
            let b = client.buffer(MIB).unwrap();
            drop(
                client
                    .start_read(p, Local::Buffer(b), 0, MIB, key, 0, T)
                    .unwrap(),
            );
            let reads: Vec<_> = (0..4)
                .map(|k| {
                    let b = client.buffer(MIB).unwrap();
                    let roff = (k * MIB) as u64;
                    client
                        .start_read(p, Local::Buffer(b), 0, MIB, key, roff, T)
                        .unwrap()
                })
                .collect();
            for (k, r) in block_on_all(reads).into_iter().enumerate() {
                let b = r.unwrap().expect("the buffer comes back");
                assert!(*b == whole[k * MIB..(k + 1) * MIB], "read {k}");
            }
            // And a write of 1 MiB at the window's start.
            let mut b = client.buffer(MIB).unwrap();
            b.copy_from_slice(&pattern(MIB, 6));
            let w = client
                .start_write(p, Local::Buffer(b), 0, MIB, key, 0, T)
                .unwrap();
            let done = block_on_all(vec![w]);
            assert!(done[0].as_ref().is_ok_and(|b| b.is_some()));
        });
        assert_eq!(ask(&client, p, &format!("check {MIB} 6")), b"ok");
        client.send(p, b"bye", T).unwrap();
    });
    let st = client.stats();
    assert_eq!(
        (st.reads, st.writes),
        (4, 1),
        "the abandoned read is not counted"
    );
}

#[test]
fn peers_not_in_the_address_vector_are_refused() {
    let test = "peers_not_in_the_address_vector_are_refused";
    let Some(a) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    let Some(b) = open(test, &config(Protocol::Tcp)) else {
        return;
    };
    // b's peer means nothing to a, which has none.
    let of_b = b.connect(a.address()).unwrap();
    let err = a.send(of_b, b"x", T).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let buf = a.buffer(16).unwrap();
    let key = RemoteKey {
        addr: 0,
        len: 16,
        key: 1,
    };
    let err = a
        .read(of_b, Local::Buffer(buf), 0, 16, key, 0, T)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    // A peer removed is refused too.
    b.disconnect(of_b).unwrap();
    let err = b.send(of_b, &[0u8; 1000], T).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert!(b.disconnect(of_b).is_err());
}

/// A write gathered from pieces of several registrations (one of them
/// memory only held, `Endpoint::hold`, which tcp and shm need not register)
/// fills scattered places of the peer's memory (what chfsd does with a
/// `ReadSpans`' chunks, `Endpoint::start_writev`); the bytes between the places stay
/// as they were, and a write whose pieces and places disagree, or that
/// has more of either than the provider takes, is refused before it is
/// posted.
fn gathered_write(protocol: Protocol, test: &str) {
    let Some(server) = open(test, &config(protocol)) else {
        return;
    };
    let Some(client) = open(test, &config(protocol)) else {
        return;
    };
    let client = Arc::new(client);
    let p = client.connect(server.address()).unwrap();
    let (a, b, c) = (pattern(5000, 1), pattern(3000, 2), pattern(10_000, 3));
    let stream: Vec<u8> = [&a[..], &b[1000..], &c[..]].concat();
    let places = [(100u64, 4000u64), (20_000, 8000), (40_000, 5000)];
    let pin = |v: &Vec<u8>| {
        client
            .pin(v.clone())
            .map_err(|(e, _)| e)
            .expect("registered")
    };
    // Held for this endpoint's own operations: peers get no key of it.
    let held = |v: &Vec<u8>| client.hold(v.clone()).map_err(|(e, _)| e).expect("held");
    let err = held(&b).remote_key(0, 10).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let pieces = || {
        vec![
            chfs_fabric::Piece {
                mem: pin(&a),
                off: 0,
                len: 5000,
            },
            chfs_fabric::Piece {
                mem: held(&b),
                off: 1000,
                len: 2000,
            },
            chfs_fabric::Piece {
                mem: pin(&c),
                off: 0,
                len: 10_000,
            },
        ]
    };
    let (most, most_places) = client.writev_limits();
    assert!(
        most >= 3 && most_places >= 3,
        "{protocol:?}: {most}/{most_places}"
    );
    let mut dst = vec![0xEEu8; 64 << 10];
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let (server, dst) = (&server, &mut dst);
        s.spawn(move || {
            server
                .expose_mut(dst, |key| {
                    tx.send(key).unwrap();
                    // Messages follow the RMA before them on the peer's
                    // connection: once this one is here, so is the data.
                    let m = server.recv(T).unwrap();
                    assert_eq!(&*m, b"done");
                })
                .unwrap();
        });
        let key: RemoteKey = rx.recv().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|inner| {
            let _stop = StopOnDrop(&stop);
            inner.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    client.progress(Duration::from_millis(20)).unwrap();
                }
            });
            // Refused before anything is posted.
            let short = [(100u64, 4000u64), (20_000, 8000)];
            let err = client
                .start_writev(p, pieces(), &short, key, T)
                .err()
                .expect("17,000 bytes into 12,000");
            assert!(matches!(err, Error::InvalidInput(_)), "{err}");
            let outside = [(100u64, 4000u64), (20_000, 8000), (64_000, 5000)];
            let err = client
                .start_writev(p, pieces(), &outside, key, T)
                .err()
                .expect("a place past the window");
            assert!(matches!(err, Error::InvalidInput(_)), "{err}");
            let many: Vec<_> = (0..=most)
                .map(|i| chfs_fabric::Piece {
                    mem: pin(&a),
                    off: i,
                    len: 1,
                })
                .collect();
            let err = client
                .start_writev(p, many, &[(0, most as u64 + 1)], key, T)
                .err()
                .expect("more pieces than the provider takes");
            assert!(matches!(err, Error::InvalidInput(_)), "{err}");
            let w = client.start_writev(p, pieces(), &places, key, T).unwrap();
            let done = block_on_all(vec![w]);
            assert!(done[0].is_ok(), "{:?}", done[0].as_ref().err());
            client.send(p, b"done", T).unwrap();
        });
    });
    let mut want = vec![0xEEu8; 64 << 10];
    let mut at = 0;
    for (roff, len) in places {
        let (roff, len) = (roff as usize, len as usize);
        want[roff..roff + len].copy_from_slice(&stream[at..at + len]);
        at += len;
    }
    assert!(
        dst == want,
        "{protocol:?}: the places hold the pieces, the rest is untouched"
    );
}

#[test]
fn a_gathered_write_fills_scattered_places_tcp() {
    gathered_write(Protocol::Tcp, "a_gathered_write_fills_scattered_places_tcp");
}

#[test]
fn a_gathered_write_fills_scattered_places_shm() {
    gathered_write(Protocol::Shm, "a_gathered_write_fills_scattered_places_shm");
}

/// `Config::poll_usec`: a waiter that reads the queue without sleeping
/// for that long after a completion finds the next replies of a quick
/// ping-pong there (`spun`, no wake-up); with 0 it sleeps in the kernel
/// for each (`slept`) and never spins. chfsd's progress thread and the
/// client's waiters get it from `--poll-usec` and `CHFS_POLL_USEC`.
#[test]
fn waiters_poll_for_the_configured_window_tcp() {
    let test = "waiters_poll_for_the_configured_window_tcp";
    for (usec, spins) in [(0u64, false), (20_000, true)] {
        let Some(server) = open(test, &config(Protocol::Tcp)) else {
            return;
        };
        let mut cfg = config(Protocol::Tcp);
        cfg.poll_usec = usec;
        let Some(client) = open(test, &cfg) else {
            return;
        };
        assert_eq!(client.poll_window(), Duration::from_micros(usec));
        let to_server = client.connect(server.address()).unwrap();
        let rounds = 300;
        std::thread::scope(|s| {
            s.spawn(|| echo(&server, rounds, false));
            client
                .send(to_server, client.address().to_string().as_bytes(), T)
                .unwrap();
            for _ in 0..rounds {
                client.send(to_server, b"ping", T).unwrap();
                assert_eq!(&*client.recv(T).unwrap(), b"ping");
            }
        });
        let st = client.stats();
        // A lone caller wakes nobody (a notification costs a system call).
        assert_eq!(st.notified, 0, "{usec} us: {st:?}");
        if spins {
            // (Some replies take longer than the window on a loaded host.)
            assert!(st.spun >= rounds as u64 / 2, "{usec} us: {st:?}");
        } else {
            assert_eq!(st.spun, 0, "{usec} us: {st:?}");
            assert!(st.slept > 0, "{usec} us: {st:?}");
        }
    }
}
