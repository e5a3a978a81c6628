//! What a libfabric provider moves on this machine, against plain TCP
//! sockets, in one run, between two processes:
//!
//! ```text
//! cargo run --release -p chfs-fabric --example fabric_bw [-- ofi+tcp|ofi+shm [MIB] [IDLE_SECS]]
//! ```
//!
//! The parent starts itself again as a server (`--serve`), then measures
//! through the provider: 64-byte message ping-pong (round trip), 1 MiB
//! messages one after another, 1 MiB RMA writes and reads of the server's
//! window; then the same ping-pong and 1 MiB puts and gets over a TCP
//! socket (TCP_NODELAY). Every buffer is written before it is timed (the
//! first touch of fresh memory costs a host fault on a VM). Last, the
//! server process's CPU time over IDLE_SECS seconds (default 5) while it
//! waits for messages with a connected, quiet peer. Between the two, the
//! RPC prototype (`chfs_fabric::rpc`, chfs-proto frames) on a second
//! endpoint of the server: `Stat` round trips, and 1 MiB `Write`s and
//! `Read`s whose data the server moves by RMA (what the provider's own
//! RMA figures above bound). `POLL_USEC=N` sets
//! both endpoints' `Config::poll_usec`.
//!
//! The provider alone, shaped like a chfs chunk call (`shaped`, on a
//! third endpoint of the server): the client sends a small request naming
//! 1 MiB of its registered memory (a remote key and an offset); one of the
//! server's DEPTH worker threads RMA-reads it into its own registered
//! buffer (what a chfs `Write` does) or RMA-writes its buffer into it (a
//! `Read`), then sends a small reply. Timed with 1 call in flight and with
//! DEPTH in flight (a window of DEPTH requests from one client thread; the
//! fourth argument, default 4), next to the streams of RMA (one after
//! another, and DEPTH in flight): the like-for-like reference for the real
//! client (`chfs-client`'s `fabric_vs_tcp` runs this program and prints
//! its ratios against these lines).
//!
//! ```text
//! fabric_bw [PROTOCOL [MIB [IDLE_SECS [DEPTH]]]]
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_fabric::rpc::{RpcClient, RpcServer, Session};
use chfs_fabric::{Address, Config, Endpoint, Local, Peer, Protocol, RemoteKey, Window};
use chfs_proto::{ErrorReply, Meta, Request, Response};

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(30);
const PINGS: usize = 5000;

fn config(protocol: Protocol) -> Config {
    let mut c = Config::new(protocol);
    if protocol == Protocol::Tcp {
        c = c.bind("127.0.0.1", None);
    }
    c.max_message = MIB + 4096;
    c.recv_buffers = 8;
    c.poll_usec = std::env::var("POLL_USEC").map_or(0, |v| v.parse().expect("POLL_USEC"));
    c
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--serve") {
        serve(
            args[2].parse().expect("protocol"),
            args[3].parse().expect("depth"),
        );
        return;
    }
    let protocol: Protocol = args
        .get(1)
        .map(|s| s.parse().expect("a protocol: ofi+tcp or ofi+shm"))
        .unwrap_or(Protocol::Tcp);
    let mib: usize = args.get(2).map_or(512, |s| s.parse().expect("MiB"));
    let idle_secs: u64 = args.get(3).map_or(5, |s| s.parse().expect("seconds"));
    let depth: usize = args.get(4).map_or(4, |s| s.parse().expect("depth"));
    assert!((1..=64).contains(&depth), "DEPTH is 1 to 64");
    measure(protocol, mib, idle_secs, depth);
}

/// The server: prints its fabric address and TCP port, serves both.
fn serve(protocol: Protocol, depth: usize) {
    let ep = Endpoint::open(&config(protocol)).expect("open");
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let rpc = RpcServer::new(Endpoint::open(&config(protocol)).expect("open"));
    let shaped = std::sync::Arc::new(Endpoint::open(&config(protocol)).expect("open"));
    println!(
        "SERVING {} {} {} {}",
        ep.address(),
        listener.local_addr().expect("addr").port(),
        rpc.endpoint().address(),
        shaped.address()
    );
    std::thread::spawn(move || serve_rpc(rpc));
    std::thread::spawn(move || serve_shaped(shaped, depth));
    std::io::stdout().flush().expect("flush");
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let s = s.expect("accept");
            std::thread::spawn(move || serve_tcp(s));
        }
    });
    let hello = ep.recv(Duration::from_secs(3600)).expect("hello");
    let back: Address = std::str::from_utf8(&hello)
        .expect("utf8")
        .parse()
        .expect("addr");
    drop(hello);
    let peer = ep.connect(&back).expect("connect");
    let mut window = None;
    loop {
        let m = ep.recv(Duration::from_secs(3600)).expect("recv");
        match m[0] {
            b'p' => {
                let reply = m.to_vec();
                drop(m);
                ep.send(peer, &reply, T).expect("pong");
            }
            b'm' => {
                let n = u64::from_le_bytes(m[1..9].try_into().expect("8")) as usize;
                drop(m);
                for _ in 0..n {
                    let d = ep.recv(T).expect("data");
                    assert_eq!(d.len(), MIB);
                }
                ep.send(peer, b"done", T).expect("done");
            }
            b'w' => {
                let len = u64::from_le_bytes(m[1..9].try_into().expect("8")) as usize;
                drop(m);
                let w = ep.window(len).expect("window");
                w.copy_in(0, &vec![5u8; len]).expect("fill");
                ep.send(peer, &w.remote_key().encode(), T).expect("key");
                window = Some(w);
            }
            b'q' => break,
            other => panic!("unknown command {other}"),
        }
    }
    drop(window);
}

/// A shaped request: `op` (`r`: the server RMA-reads the client's memory,
/// `w`: it RMA-writes it), the client's key, the offset in it, a tag the
/// reply carries back.
const SHAPED_REQ: usize = 1 + RemoteKey::LEN + 8 + 8;

fn shaped_request(op: u8, key: RemoteKey, roff: u64, tag: u64) -> [u8; SHAPED_REQ] {
    let mut m = [0u8; SHAPED_REQ];
    m[0] = op;
    m[1..25].copy_from_slice(&key.encode());
    m[25..33].copy_from_slice(&roff.to_le_bytes());
    m[33..41].copy_from_slice(&tag.to_le_bytes());
    m
}

/// The provider alone serving chfs-shaped calls: `depth` worker threads,
/// each with its own registered 1 MiB buffer, take requests from the one
/// endpoint, move the data by RMA and reply.
fn serve_shaped(ep: std::sync::Arc<Endpoint>, depth: usize) {
    let hello = ep.recv(Duration::from_secs(3600)).expect("hello");
    let back: Address = std::str::from_utf8(&hello)
        .expect("utf8")
        .parse()
        .expect("addr");
    drop(hello);
    let peer = ep.connect(&back).expect("connect");
    ep.send(peer, b"ready", T).expect("ready");
    for _ in 0..depth {
        let ep = ep.clone();
        std::thread::spawn(move || {
            let mut buf = ep.buffer(MIB).expect("buffer");
            buf.fill(4);
            loop {
                let m = ep.recv(Duration::from_secs(3600)).expect("request");
                assert_eq!(m.len(), SHAPED_REQ, "a shaped request");
                let op = m[0];
                let key = RemoteKey::decode(&m[1..25]).expect("key");
                let roff = u64::from_le_bytes(m[25..33].try_into().expect("8"));
                let tag: [u8; 8] = m[33..41].try_into().expect("8");
                drop(m);
                buf = match op {
                    b'r' => ep.read(peer, Local::Buffer(buf), 0, MIB, key, roff, T),
                    b'w' => ep.write(peer, Local::Buffer(buf), 0, MIB, key, roff, T),
                    other => panic!("unknown shaped op {other}"),
                }
                .expect("rma")
                .expect("buffer back");
                ep.send(peer, &tag, T).expect("reply");
            }
        });
    }
}

/// Client of [`serve_shaped`]: `mib` calls of `op`, `depth` in flight
/// (each on its own MiB of `win`), one client thread.
fn shaped_run(ep: &Endpoint, p: Peer, win: &Window, op: u8, mib: usize, depth: usize) -> Duration {
    let key = win.remote_key();
    let send = |slot: usize| {
        let m = shaped_request(op, key, (slot * MIB) as u64, slot as u64);
        ep.send(p, &m, T).expect("shaped request");
    };
    let t0 = Instant::now();
    let first = depth.min(mib);
    for slot in 0..first {
        send(slot);
    }
    let (mut sent, mut done) = (first, 0);
    while done < mib {
        let r = ep.recv(T).expect("shaped reply");
        let slot = u64::from_le_bytes(r[..8].try_into().expect("a tag")) as usize;
        drop(r);
        done += 1;
        if sent < mib {
            send(slot);
            sent += 1;
        }
    }
    t0.elapsed()
}

fn shaped_measure(protocol: Protocol, server: &Address, mib: usize, depth: usize) {
    let ep = Endpoint::open(&config(protocol)).expect("open");
    let p = ep.connect(server).expect("connect");
    ep.send(p, ep.address().to_string().as_bytes(), T)
        .expect("hello");
    assert_eq!(&*ep.recv(T).expect("ready"), b"ready");
    let win = ep.window(depth * MIB).expect("window");
    win.copy_in(0, &vec![6u8; depth * MIB]).expect("fill");
    // Warm-up: rxm's connection, the server's threads.
    shaped_run(&ep, p, &win, b'r', 2 * depth, depth);
    for n in [1, depth] {
        let took = shaped_run(&ep, p, &win, b'r', mib, n);
        bw_line(
            &format!("{protocol} shaped writes, {n} in flight"),
            mib * MIB,
            took,
        );
    }
    // The server's buffers hold 4s, or the 6s they pulled: the reads
    // replace these zeros.
    win.copy_in(0, &vec![0u8; depth * MIB]).expect("zero");
    for n in [1, depth] {
        let took = shaped_run(&ep, p, &win, b'w', mib, n);
        bw_line(
            &format!("{protocol} shaped reads, {n} in flight"),
            mib * MIB,
            took,
        );
    }
    let mut back = vec![0u8; depth * MIB];
    win.copy_out(0, &mut back).expect("copy out");
    assert!(
        back.iter().all(|&b| b == 4 || b == 6),
        "the server's bytes arrived"
    );
}

/// The RPC server: Stat answers a fixed entry, a Write keeps its data, a
/// Read answers with the last data written.
fn serve_rpc(mut rpc: RpcServer) {
    let mut chunk = Bytes::from(vec![1u8; MIB]);
    let mut handler = move |req: Request| -> Result<Response, ErrorReply> {
        match req {
            Request::Stat { .. } => Ok(Response::Meta(Meta {
                mode: libc::S_IFREG | 0o644,
                size: 42,
                ..Meta::default()
            })),
            Request::Write { data, .. } => {
                let n = data.len() as u32;
                chunk = data;
                Ok(Response::Written(n))
            }
            Request::Read { len, .. } => Ok(Response::Data(
                chunk.slice(..(len as usize).min(chunk.len())),
            )),
            _ => Err(ErrorReply::new(libc::ENOSYS, "not here")),
        }
    };
    loop {
        rpc.serve_one(Duration::from_secs(3600), &mut handler)
            .expect("serve");
    }
}

fn rpc_measure(protocol: Protocol, server: &Address, mib: usize) {
    let client = RpcClient::new(std::sync::Arc::new(
        Endpoint::open(&config(protocol)).expect("open"),
    ));
    let s: Session = client.connect(server, T).expect("rpc connect");
    let stat = Request::Stat { path: "/f".into() };
    for _ in 0..500 {
        client.call(&s, &stat, T).expect("stat");
    }
    let rtts: Vec<Duration> = (0..PINGS)
        .map(|_| {
            let t0 = Instant::now();
            client.call(&s, &stat, T).expect("stat");
            t0.elapsed()
        })
        .collect();
    rtt_line(&format!("{protocol} RPC Stat round trip"), rtts);
    let write = Request::Write {
        path: "/f".into(),
        fileid: 1,
        chunk_size: MIB as u32,
        mode: libc::S_IFREG | 0o644,
        idx: 0,
        off: 0,
        flags: 0,
        epoch: 0,
        data: Bytes::new(),
    };
    let data = vec![8u8; MIB];
    let t0 = Instant::now();
    for _ in 0..mib {
        client.write(&s, &write, &data, T).expect("write");
    }
    bw_line(
        &format!("{protocol} RPC 1 MiB writes (RMA)"),
        mib * MIB,
        t0.elapsed(),
    );
    let read = Request::Read {
        path: "/f".into(),
        fileid: 1,
        idx: 0,
        off: 0,
        len: MIB as u32,
        chunk_size: MIB as u32,
        flags: 0,
        epoch: 0,
    };
    let mut dst = vec![0u8; MIB];
    let t0 = Instant::now();
    for _ in 0..mib {
        let n = client.read(&s, &read, &mut dst, T).expect("read");
        assert_eq!(n, MIB);
    }
    bw_line(
        &format!("{protocol} RPC 1 MiB reads (RMA)"),
        mib * MIB,
        t0.elapsed(),
    );
    assert!(dst.iter().all(|&b| b == 8), "the data written came back");
}

fn serve_tcp(mut s: TcpStream) {
    s.set_nodelay(true).expect("nodelay");
    let mut op = [0u8; 1];
    if s.read_exact(&mut op).is_err() {
        return;
    }
    match op[0] {
        b'p' => {
            let mut b = [0u8; 64];
            while s.read_exact(&mut b).is_ok() {
                s.write_all(&b).expect("pong");
            }
        }
        b'u' | b'd' => {
            let mut n = [0u8; 8];
            s.read_exact(&mut n).expect("len");
            let total = u64::from_le_bytes(n) as usize;
            let mut buf = vec![3u8; MIB];
            let mut left = total;
            while left > 0 {
                let k = left.min(MIB);
                if op[0] == b'u' {
                    s.read_exact(&mut buf[..k]).expect("data");
                } else {
                    s.write_all(&buf[..k]).expect("data");
                }
                left -= k;
            }
            if op[0] == b'u' {
                s.write_all(b"k").expect("ack");
            }
        }
        other => panic!("unknown tcp op {other}"),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

fn rtt_line(name: &str, mut rtts: Vec<Duration>) {
    rtts.sort();
    println!(
        "{name:<34} median {:>7.1} us   p99 {:>7.1} us",
        percentile(&rtts, 0.5).as_secs_f64() * 1e6,
        percentile(&rtts, 0.99).as_secs_f64() * 1e6
    );
}

fn bw_line(name: &str, bytes: usize, took: Duration) {
    println!(
        "{name:<34} {:>8.0} MiB/s   ({} MiB in {:.3} s)",
        bytes as f64 / MIB as f64 / took.as_secs_f64(),
        bytes / MIB,
        took.as_secs_f64()
    );
}

/// CPU time (user + system) of process `pid` from /proc, in seconds.
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect(")") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), utime and stime, are 11 and 12 after
    // the state field.
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf takes a constant and returns a number.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

/// 1 MiB RMA reads (or writes) with `depth` in flight (chfs keeps a window
/// of chunk transfers in flight), started here and completed by a progress
/// thread.
fn rma_in_flight(
    ep: &std::sync::Arc<Endpoint>,
    p: Peer,
    key: RemoteKey,
    mib: usize,
    depth: usize,
    write: bool,
) {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                ep.progress(Duration::from_millis(20)).expect("progress");
            }
        });
        let start = |b| {
            if write {
                ep.start_write(p, Local::Buffer(b), 0, MIB, key, 0, T)
            } else {
                ep.start_read(p, Local::Buffer(b), 0, MIB, key, 0, T)
            }
            .expect("start")
        };
        let mut flying: Vec<_> = (0..depth)
            .map(|_| start(ep.buffer(MIB).expect("buffer")))
            .collect();
        let (mut started, mut done) = (depth, 0);
        let t0 = Instant::now();
        while done < mib {
            let mut progressed = false;
            let mut i = 0;
            while i < flying.len() {
                match std::pin::Pin::new(&mut flying[i]).poll(&mut cx) {
                    Poll::Ready(r) => {
                        let b = r.expect("read").expect("buffer back");
                        done += 1;
                        progressed = true;
                        if started < mib {
                            flying[i] = start(b);
                            started += 1;
                            i += 1;
                        } else {
                            drop(flying.swap_remove(i));
                        }
                    }
                    Poll::Pending => i += 1,
                }
            }
            if !progressed {
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
        bw_line(
            &format!(
                "{} 1 MiB RMA {}, {depth} in flight",
                ep.address().protocol,
                if write { "writes" } else { "reads" }
            ),
            mib * MIB,
            t0.elapsed(),
        );
        stop.store(true, Ordering::Release);
    });
}

fn ask(ep: &Endpoint, p: Peer, msg: &[u8]) -> Vec<u8> {
    ep.send(p, msg, T).expect("send");
    ep.recv(T).expect("recv").to_vec()
}

fn measure(protocol: Protocol, mib: usize, idle_secs: u64, depth: usize) {
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["--serve", protocol.name(), &depth.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the server's address");
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"SERVING"), "{line}");
    let server: Address = words[1].parse().expect("address");
    let tcp_port: u16 = words[2].parse().expect("port");
    let rpc_server: Address = words[3].parse().expect("rpc address");
    let shaped_server: Address = words[4].parse().expect("shaped address");

    let ep = std::sync::Arc::new(Endpoint::open(&config(protocol)).expect("open"));
    println!(
        "libfabric {} provider {} (domain {}, wait {:?}), {} MiB per bandwidth run, 2 processes",
        chfs_fabric::libfabric_version().unwrap_or_default(),
        ep.attr().provider,
        ep.attr().domain,
        ep.wait_kind(),
        mib
    );
    let p = ep.connect(&server).expect("connect");
    ep.send(p, ep.address().to_string().as_bytes(), T)
        .expect("hello");

    // Message ping-pong.
    let mut ping = [0u8; 64];
    ping[0] = b'p';
    for _ in 0..500 {
        ask(&ep, p, &ping);
    }
    let rtts: Vec<Duration> = (0..PINGS)
        .map(|_| {
            let t0 = Instant::now();
            let r = ask(&ep, p, &ping);
            let t = t0.elapsed();
            assert_eq!(r.len(), 64);
            t
        })
        .collect();
    rtt_line(&format!("{} 64 B message round trip", protocol), rtts);

    // 1 MiB messages, one after another.
    let mut buf = ep.buffer(MIB).expect("buffer");
    buf.fill(7);
    let mut cmd = vec![b'm'];
    cmd.extend_from_slice(&(mib as u64).to_le_bytes());
    ep.send(p, &cmd, T).expect("cmd");
    let t0 = Instant::now();
    for _ in 0..mib {
        buf = ep.send_buffer(p, buf, 0, MIB, T).expect("send 1 MiB");
    }
    let done = ep.recv(T).expect("done");
    assert_eq!(&*done, b"done");
    drop(done);
    bw_line(
        &format!("{} 1 MiB messages", protocol),
        mib * MIB,
        t0.elapsed(),
    );

    // RMA into and out of the server's window.
    let mut cmd = vec![b'w'];
    cmd.extend_from_slice(&(MIB as u64).to_le_bytes());
    let key = RemoteKey::decode(&ask(&ep, p, &cmd)).expect("key");
    let t0 = Instant::now();
    for _ in 0..mib {
        buf = ep
            .write(p, Local::Buffer(buf), 0, MIB, key, 0, T)
            .expect("write")
            .expect("buffer back");
    }
    ask(&ep, p, &ping); // the writes are done before the answer
    bw_line(
        &format!("{} 1 MiB RMA writes", protocol),
        mib * MIB,
        t0.elapsed(),
    );
    buf.fill(0);
    let t0 = Instant::now();
    for _ in 0..mib {
        buf = ep
            .read(p, Local::Buffer(buf), 0, MIB, key, 0, T)
            .expect("read")
            .expect("buffer back");
    }
    bw_line(
        &format!("{} 1 MiB RMA reads", protocol),
        mib * MIB,
        t0.elapsed(),
    );
    // The window holds what the writes put there.
    assert!(buf.iter().all(|&b| b == 7), "the window's bytes");
    drop(buf);
    rma_in_flight(&ep, p, key, mib, depth, true);
    rma_in_flight(&ep, p, key, mib, depth, false);

    // The provider alone, shaped like chfs's chunk calls.
    shaped_measure(protocol, &shaped_server, mib, depth);

    // The RPC prototype: frames over messages, bulk data by RMA.
    rpc_measure(protocol, &rpc_server, mib);

    // Plain TCP sockets, same processes.
    let connect = |op: u8| {
        let mut s = TcpStream::connect(("127.0.0.1", tcp_port)).expect("tcp connect");
        s.set_nodelay(true).expect("nodelay");
        s.write_all(&[op]).expect("op");
        s
    };
    let mut s = connect(b'p');
    let mut b = [1u8; 64];
    for _ in 0..500 {
        s.write_all(&b).expect("ping");
        s.read_exact(&mut b).expect("pong");
    }
    let rtts: Vec<Duration> = (0..PINGS)
        .map(|_| {
            let t0 = Instant::now();
            s.write_all(&b).expect("ping");
            s.read_exact(&mut b).expect("pong");
            t0.elapsed()
        })
        .collect();
    drop(s);
    rtt_line("TCP socket 64 B round trip", rtts);
    let mut data = vec![9u8; MIB];
    let total = mib * MIB;
    let mut s = connect(b'u');
    let t0 = Instant::now();
    s.write_all(&(total as u64).to_le_bytes()).expect("len");
    for _ in 0..mib {
        s.write_all(&data).expect("put");
    }
    s.read_exact(&mut [0u8; 1]).expect("ack");
    bw_line("TCP socket 1 MiB puts", total, t0.elapsed());
    let mut s = connect(b'd');
    let t0 = Instant::now();
    s.write_all(&(total as u64).to_le_bytes()).expect("len");
    for _ in 0..mib {
        s.read_exact(&mut data).expect("get");
    }
    bw_line("TCP socket 1 MiB gets", total, t0.elapsed());

    // The server idle, waiting for messages from its connected peer.
    std::thread::sleep(Duration::from_millis(200));
    let cpu0 = process_cpu(child.id());
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let cpu = process_cpu(child.id()) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{:<34} {:.3} s CPU in {:.1} s = {:.2}% of a core",
        format!("{} idle server", protocol),
        cpu,
        wall,
        100.0 * cpu / wall
    );

    ep.send(p, b"q", T).expect("quit");
    let status = child.wait().expect("wait");
    assert!(status.success(), "server: {status}");
}
