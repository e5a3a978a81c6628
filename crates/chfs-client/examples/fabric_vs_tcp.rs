//! The real client over `ofi+tcp` against TCP, in one run: one chfsd per
//! transport on loopback (release builds: `cargo build --release -p
//! chfs-server` first), and through `chfs_client::Client`
//!
//! ```text
//! cargo run --release -p chfs-client --example fabric_vs_tcp [-- MIB [STATS [THREADS]]]
//! ```
//!
//! 1 MiB `pwrite`s then `pread`s of a file of MIB MiB (default 512) with
//! 1 MiB chunks (over the fabric: one RMA each, CHFS_RDMA_THRESH) and with
//! 64 KiB chunks (16 chunk RPCs per call, over the fabric one RMA each
//! too), and STATS `stat` calls (default 20000) one after another.
//!
//! Writes are timed twice: into a fresh store (the server's memory for
//! each chunk is new: the first touch of its pages is paid, which on this
//! VM runs at about 1 GiB/s, issue 25), then as an overwrite of the same
//! file (the store's memory is reused, as a provider's bandwidth program
//! reuses one buffer). The ratios printed at the end compare the fabric
//! with TCP on overwrites and on reads. Each pass also prints the CPU
//! time the client (this process) and the server spent per MiB, which a
//! loaded machine disturbs less than the wall-clock rates. The TCP client goes
//! over TCP loopback (CHFS_LOCAL_SOCKET=0, CHFS_CMA=0: the same path as
//! to another host). Then the fabric server's CPU time over 5 idle
//! seconds. Prints one line per figure and the load average.
//! `CHFS_RDMA_THRESH` sets the client's threshold (default 32 KiB).
//!
//! With 1 MiB chunks, overwrites and reads are also timed from THREADS
//! threads (default 4) at once, each moving its own chunks (chunk i by
//! thread i mod THREADS): THREADS calls in flight. And first, the
//! provider alone: chfs-fabric's `fabric_bw` (built beside this program:
//! `cargo build --release -p chfs-fabric --example fabric_bw`) run with
//! the same MIB and THREADS, whose "shaped" lines are a chfs chunk call
//! without chfs (small request, the server's 1 MiB RMA, small reply) at 1
//! and THREADS in flight, and whose RMA lines are streams. The closing
//! lines print chfs over `ofi+tcp` against each, and against chfs over
//! TCP, at 1 and at THREADS in flight.

use std::time::{Duration, Instant};

use chfs_client::flags::*;
use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};

const MIB: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).map_or(512, |s| s.parse().expect("MiB"));
    let stats: usize = args.get(2).map_or(20_000, |s| s.parse().expect("stats"));
    let threads: usize = args.get(3).map_or(4, |s| s.parse().expect("threads"));
    assert!(threads >= 1, "THREADS is at least 1");
    println!("load average before: {}", loadavg());
    let provider = provider_figures(mib, threads);
    let mut at_t = Vec::new();
    let mut results = Vec::new();
    for proto in ["tcp", "ofi+tcp"] {
        let p = LocalPool::start_with(PoolOptions {
            servers: 1,
            args: if proto == "tcp" {
                vec![]
            } else {
                vec!["-p".into(), proto.into()]
            },
            ..Default::default()
        })
        .expect("start chfsd (cargo build --release -p chfs-server)");
        let c = Client::connect(ClientConfig {
            servers: p.addrs().to_vec(),
            local_socket: false,
            cma: false,
            rpc_timeout: Duration::from_secs(60),
            rdma_thresh: std::env::var("CHFS_RDMA_THRESH")
                .map_or(32 << 10, |v| v.parse().expect("CHFS_RDMA_THRESH")),
            ..Default::default()
        })
        .expect("connect");
        for cs in [MIB as u32, 64 << 10] {
            c.set_chunk_size(cs).unwrap();
            let [fresh, w, r] = bandwidth(&c, mib, cs, p.pid(0).expect("pid"));
            println!(
                "{proto:8} chunk {:>4} KiB: 1 MiB pwrite fresh {:7.0}, overwrite {:7.0} MiB/s, pread {:7.0} MiB/s",
                cs >> 10,
                fresh.rate,
                w.rate,
                r.rate
            );
            println!(
                "{proto:8} chunk {:>4} KiB: CPU us per MiB, client/server: fresh {:.0}/{:.0}, overwrite {:.0}/{:.0}, pread {:.0}/{:.0}",
                cs >> 10,
                fresh.client_us,
                fresh.server_us,
                w.client_us,
                w.server_us,
                r.client_us,
                r.server_us
            );
            results.push((proto, cs, w.rate, r.rate));
        }
        c.set_chunk_size(MIB as u32).unwrap();
        let [w, r] = bandwidth_threads(&c, mib, threads, p.pid(0).expect("pid"));
        println!(
            "{proto:8} chunk 1024 KiB, {threads} threads: 1 MiB overwrite {:7.0} MiB/s, pread {:7.0} MiB/s; CPU us per MiB, client/server: overwrite {:.0}/{:.0}, pread {:.0}/{:.0}",
            w.rate, r.rate, w.client_us, w.server_us, r.client_us, r.server_us
        );
        at_t.push((proto, w.rate, r.rate));
        let us = stat_rate(&c, stats);
        println!(
            "{proto:8} stat: {us:.1} us per call, {:.0} per second",
            1e6 / us
        );
        if proto != "tcp" {
            let pid = p.pid(0).expect("pid");
            let before = cpu_ticks(pid);
            std::thread::sleep(Duration::from_secs(5));
            let ticks = cpu_ticks(pid) - before;
            // SAFETY: sysconf has no memory effects.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            println!(
                "{proto:8} idle server: {:.2}% of a core over 5 s",
                ticks as f64 / hz / 5.0 * 100.0
            );
        }
        drop(c);
        p.stop();
    }
    for cs in [MIB as u32, 64 << 10] {
        let get = |p: &str| results.iter().find(|r| r.0 == p && r.1 == cs);
        if let (Some(t), Some(f)) = (get("tcp"), get("ofi+tcp")) {
            println!(
                "ofi+tcp / tcp, chunk {:>4} KiB: overwrite {:.0}%, pread {:.0}%",
                cs >> 10,
                f.2 / t.2 * 100.0,
                f.3 / t.3 * 100.0
            );
        }
    }
    let tcp1 = results.iter().find(|r| r.0 == "tcp" && r.1 == MIB as u32);
    let ofi1 = results
        .iter()
        .find(|r| r.0 == "ofi+tcp" && r.1 == MIB as u32);
    let tcpt = at_t.iter().find(|r| r.0 == "tcp");
    let ofit = at_t.iter().find(|r| r.0 == "ofi+tcp");
    if let (Some(o1), Some(ot)) = (ofi1, ofit) {
        let pct = |a: f64, b: Option<f64>| {
            b.map_or("-".to_string(), |b| format!("{:.0}%", a / b * 100.0))
        };
        let fig = |name: &str| provider.iter().find(|f| f.0 == name).map(|f| f.1);
        for (label, n, w, r, tcp) in [
            ("1 in flight", 1, o1.2, o1.3, tcp1.map(|t| (t.2, t.3))),
            ("threads", threads, ot.1, ot.2, tcpt.map(|t| (t.1, t.2))),
        ] {
            let (sw, sr) = (
                fig(&format!("shaped writes, {n} in flight")),
                fig(&format!("shaped reads, {n} in flight")),
            );
            let (stw, str_) = if n == 1 {
                (fig("1 MiB RMA reads"), fig("1 MiB RMA writes"))
            } else {
                (
                    fig(&format!("1 MiB RMA reads, {n} in flight")),
                    fig(&format!("1 MiB RMA writes, {n} in flight")),
                )
            };
            println!(
                "chfs ofi+tcp, 1 MiB chunks, {label} ({n}): overwrite / provider shaped {}, / provider stream {}, / chfs tcp {}; pread / provider shaped {}, / provider stream {}, / chfs tcp {}",
                pct(w, sw),
                pct(w, stw),
                pct(w, tcp.map(|t| t.0)),
                pct(r, sr),
                pct(r, str_),
                pct(r, tcp.map(|t| t.1)),
            );
        }
    }
    println!("load average after: {}", loadavg());
}

/// Runs chfs-fabric's `fabric_bw` (found beside this program) over
/// `ofi+tcp` and returns its bandwidth lines as (name without the
/// protocol, MiB/s); empty, with a note, when it is not built.
fn provider_figures(mib: usize, threads: usize) -> Vec<(String, f64)> {
    let exe = std::env::current_exe().expect("exe");
    let bw = exe.with_file_name("fabric_bw");
    if !bw.exists() {
        println!(
            "provider: {} not built (cargo build --release -p chfs-fabric --example fabric_bw): no provider ratios",
            bw.display()
        );
        return Vec::new();
    }
    let out = std::process::Command::new(&bw)
        .args(["ofi+tcp", &mib.to_string(), "1", &threads.to_string()])
        .output()
        .expect("run fabric_bw");
    assert!(out.status.success(), "fabric_bw: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut figures = Vec::new();
    for line in text.lines() {
        println!("provider: {line}");
        let Some(rest) = line.strip_prefix("ofi+tcp ") else {
            continue;
        };
        if let Some((name, tail)) = rest.split_once("  ") {
            if let Some(rate) = tail.split_whitespace().next().and_then(|w| w.parse().ok()) {
                if tail.contains("MiB/s") {
                    figures.push((name.trim().to_string(), rate));
                }
            }
        }
    }
    figures
}

/// Overwrites then preads of `mib` MiB by `threads` threads at once,
/// thread t moving chunks t, t + threads, ... (the file is written first).
fn bandwidth_threads(c: &Client, mib: usize, threads: usize, server: u32) -> [Pass; 2] {
    let path = "/bw-threads";
    let fd = c.create(path, O_RDWR, 0o644).unwrap();
    let pattern = |i: usize| -> Vec<u8> { (0..MIB).map(|k| ((k + i * 7) % 253) as u8).collect() };
    let bufs: Vec<Vec<u8>> = (0..threads).map(pattern).collect();
    let write_all = || {
        std::thread::scope(|s| {
            for (t, buf) in bufs.iter().enumerate() {
                s.spawn(move || {
                    for i in (t..mib).step_by(threads) {
                        assert_eq!(c.pwrite(fd, buf, (i * MIB) as u64).unwrap(), MIB);
                    }
                });
            }
        })
    };
    write_all();
    let w = pass(mib, server, write_all);
    let r = pass(mib, server, || {
        std::thread::scope(|s| {
            for (t, want) in bufs.iter().enumerate() {
                s.spawn(move || {
                    let mut buf = vec![0u8; MIB];
                    for i in (t..mib).step_by(threads) {
                        assert_eq!(c.pread(fd, &mut buf, (i * MIB) as u64).unwrap(), MIB);
                    }
                    assert!(&buf == want, "the last MiB thread {t} read back differs");
                });
            }
        })
    });
    c.close(fd).unwrap();
    c.unlink(path).unwrap();
    [w, r]
}

/// One timed pass: MiB/s, and CPU microseconds per MiB of this process
/// (the client) and of the server.
struct Pass {
    rate: f64,
    client_us: f64,
    server_us: f64,
}

/// Times `f` moving `mib` MiB.
fn pass(mib: usize, server: u32, mut f: impl FnMut()) -> Pass {
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (c0, s0) = (self_cpu(), cpu_ticks(server));
    let t = Instant::now();
    f();
    let secs = t.elapsed().as_secs_f64();
    let (c1, s1) = (self_cpu(), cpu_ticks(server));
    Pass {
        rate: mib as f64 / secs,
        client_us: (c1 - c0).as_secs_f64() * 1e6 / mib as f64,
        server_us: (s1 - s0) as f64 / hz * 1e6 / mib as f64,
    }
}

/// This process's CPU time (user and system).
fn self_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// 1 MiB pwrites of a new file of `mib` MiB, pwrites over it again, then
/// preads of it.
fn bandwidth(c: &Client, mib: usize, cs: u32, server: u32) -> [Pass; 3] {
    let path = format!("/bw-{cs}");
    let mut buf = vec![0u8; MIB];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let want = buf.clone();
    let fd = c.create(&path, O_RDWR, 0o644).unwrap();
    // Warm-up: connections, windows and buffers.
    for i in 0..8 {
        c.pwrite(fd, &buf, (i * MIB) as u64).unwrap();
    }
    let write_all = || {
        for i in 0..mib {
            assert_eq!(c.pwrite(fd, &buf, (i * MIB) as u64).unwrap(), MIB);
        }
    };
    let fresh = pass(mib, server, write_all);
    let w = pass(mib, server, write_all);
    let r = pass(mib, server, || {
        for i in 0..mib {
            assert_eq!(c.pread(fd, &mut buf, (i * MIB) as u64).unwrap(), MIB);
        }
    });
    assert!(buf == want, "the last MiB read back differs");
    c.close(fd).unwrap();
    c.unlink(&path).unwrap();
    [fresh, w, r]
}

/// Microseconds per stat of one file.
fn stat_rate(c: &Client, n: usize) -> f64 {
    let fd = c.create("/stat-me", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    for _ in 0..100 {
        c.stat("/stat-me").unwrap();
    }
    let t = Instant::now();
    for _ in 0..n {
        c.stat("/stat-me").unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime: fields 14 and 15, i.e. 11 and 12 after the name.
    f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
