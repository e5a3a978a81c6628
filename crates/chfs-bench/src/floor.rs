//! The round-trip floor: what one request and its reply cost before any
//! file-system work, measured in the same run as the phases it explains.
//!
//! Two layers. The *transport* floor is a 32-byte ping-pong between two
//! threads of this process over a Unix socket pair and over loopback TCP,
//! with both threads pinned to one CPU and to two different CPUs (where
//! waking a thread on another, idle CPU costs most of the round trip on
//! some machines). The *RPC* floor is a no-op request
//! ([`Client::ping`]) answered by a chfsd, through the client's usual
//! path: over the server's Unix socket on a CPU lane (the calling thread
//! pinned, served on its CPU), over the Unix socket without a lane, and
//! over TCP. A metadata operation cannot cost less than one RPC round trip;
//! the report puts each metadata phase's cost per operation next to them.
//!
//! A third figure is the *stream* ceiling: what the same kind of
//! connections carry when they do nothing but move data, 1 MiB writes
//! from as many sender threads as the run has ranks (each pinned to a
//! rank's CPU, as the ranks are) to as many receivers (not pinned, as
//! chfsd's threads are not), over Unix socket pairs and loopback TCP
//! ([`transport_streams`]). ior-easy's bandwidth over a transport is
//! put next to what that transport carries in the same run.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use chfs_client::{Client, ClientConfig, CpuLanes};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::{BenchError, Result};

/// Round trips measured for each figure (after as many again to warm up).
pub const DEFAULT_ROUNDS: usize = 20_000;

/// Seconds each stream ceiling is measured for.
pub const STREAM_SECS: f64 = 1.0;

/// A socket kind for the transport floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

fn connected_pair(t: Transport) -> std::io::Result<(Box<dyn Stream>, Box<dyn Stream>)> {
    Ok(match t {
        Transport::Unix => {
            let (a, b) = UnixStream::pair()?;
            (Box::new(a), Box::new(b))
        }
        Transport::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let a = TcpStream::connect(l.local_addr()?)?;
            let (b, _) = l.accept()?;
            a.set_nodelay(true)?;
            b.set_nodelay(true)?;
            (Box::new(a), Box::new(b))
        }
    })
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Median round trip in µs of `rounds` 32-byte ping-pongs over `t` between
/// a thread on CPU `a` and one on CPU `b` (None: not pinned).
pub fn transport_rtt(
    t: Transport,
    a: Option<usize>,
    b: Option<usize>,
    rounds: usize,
) -> std::io::Result<f64> {
    let (mut x, mut y) = connected_pair(t)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        if let Some(cpu) = b {
            chfs_sys::cpu::pin_current_thread(cpu)?;
        }
        let mut m = [0u8; 32];
        loop {
            match y.read_exact(&mut m) {
                Ok(()) => y.write_all(&m)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let ping = std::thread::spawn(move || -> std::io::Result<f64> {
        if let Some(cpu) = a {
            chfs_sys::cpu::pin_current_thread(cpu)?;
        }
        let mut m = [7u8; 32];
        let mut times = Vec::with_capacity(rounds);
        for i in 0..2 * rounds {
            let t0 = Instant::now();
            x.write_all(&m)?;
            x.read_exact(&mut m)?;
            if i >= rounds {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(median(&mut times))
    });
    let r = joined(ping);
    joined(echo)?;
    r
}

/// Bytes per write of a stream.
const STREAM_MSG: usize = 1 << 20;

/// GiB/s carried by `pairs` connections over `t` at once, each a sender
/// writing 1 MiB at a time for `secs` (pinned to `cpus[i % len]` when
/// `cpus` is not empty) and a receiver reading 1 MiB at a time.
pub fn transport_streams(
    t: Transport,
    pairs: usize,
    cpus: &[usize],
    secs: f64,
) -> std::io::Result<f64> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(pairs + 1));
    let mut senders = Vec::with_capacity(pairs);
    let mut receivers = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let (mut x, mut y) = connected_pair(t)?;
        let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
        let go = start.clone();
        senders.push(std::thread::spawn(move || -> std::io::Result<u64> {
            if let Some(cpu) = cpu {
                chfs_sys::cpu::pin_current_thread(cpu)?;
            }
            let m = vec![0x5au8; STREAM_MSG];
            go.wait();
            let (t0, mut sent) = (Instant::now(), 0u64);
            while t0.elapsed().as_secs_f64() < secs {
                x.write_all(&m)?;
                sent += m.len() as u64;
            }
            Ok(sent)
        }));
        receivers.push(std::thread::spawn(move || -> std::io::Result<u64> {
            let mut m = vec![0u8; STREAM_MSG];
            let mut got = 0u64;
            loop {
                match y.read(&mut m)? {
                    0 => return Ok(got),
                    n => got += n as u64,
                }
            }
        }));
    }
    start.wait();
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut first_err = None;
    for h in senders {
        match joined(h) {
            Ok(n) => sent += n,
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    // The senders' writes have all returned: what they sent was taken by
    // the kernel, and what the receivers have not read yet is at most the
    // sockets' buffers (the receivers drain them before they see EOF).
    let elapsed = t0.elapsed().as_secs_f64();
    let mut got = 0u64;
    for h in receivers {
        got += joined(h)?;
    }
    match first_err {
        Some(e) => Err(e),
        None if got != sent => Err(std::io::Error::other(format!(
            "streams: {sent} bytes sent but {got} received"
        ))),
        None => Ok(sent as f64 / (1u64 << 30) as f64 / elapsed.max(1e-9)),
    }
}

/// Bytes each thread of [`fresh_memory`] fills.
const FRESH_BYTES: usize = 256 << 20;

/// What [`fresh_memory`] measured: GiB/s at which threads filled memory
/// their process had not used before.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct FreshMemory {
    /// On the pages the system gives without asking (4 KiB unless
    /// transparent huge pages are `always`; as chfsd's heap by default),
    /// the first pass.
    pub first_touch: f64,
    /// The same again: the pages the first pass just gave back.
    pub again: f64,
    /// Again, on transparent huge pages (chfsd `--huge-pages on`).
    pub huge_pages: f64,
}

/// GiB/s at which `threads` threads at once fill memory this process
/// did not use before, 1 MiB copied at a time (each `bytes` of anonymous
/// memory; not pinned, as chfsd's threads are not): the ceiling of writes
/// of new data into a memory store, each new chunk being such memory.
/// Three passes: on the pages the system gives without asking (4 KiB
/// unless transparent huge pages are `always`; as chfsd's heap by
/// default), the same again (the pages the first pass just gave back),
/// and again on huge pages. On bare metal the first two agree; a virtual machine whose host
/// backs guest memory only when first touched, and takes back what the
/// guest freed a few seconds earlier (free page reporting), pays a host
/// page fault per page in the first pass and not in the second. The last
/// two differ by the page faults huge pages save.
pub fn fresh_memory(threads: usize, bytes: usize) -> std::io::Result<FreshMemory> {
    Ok(FreshMemory {
        first_touch: fill_fresh(threads, bytes, false)?,
        again: fill_fresh(threads, bytes, false)?,
        huge_pages: fill_fresh(threads, bytes, true)?,
    })
}

fn fill_fresh(threads: usize, bytes: usize, huge: bool) -> std::io::Result<f64> {
    let threads = threads.max(1);
    let start = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let mut fillers = Vec::with_capacity(threads);
    for _ in 0..threads {
        let go = start.clone();
        fillers.push(std::thread::spawn(move || -> std::io::Result<f64> {
            let src = vec![0x5au8; STREAM_MSG];
            let mut m = memmap2::MmapOptions::new().len(bytes).map_anon()?;
            // Huge pages asked for (refused where the kernel has none), or
            // what the system gives without asking, as chfsd's heap gets
            // by default: 4 KiB pages, unless transparent huge pages are
            // on for every process (`always`).
            if huge {
                let _ = m.advise(memmap2::Advice::HugePage);
            }
            go.wait();
            let t0 = Instant::now();
            for c in m.chunks_mut(STREAM_MSG) {
                c.copy_from_slice(&src[..c.len()]);
            }
            Ok(t0.elapsed().as_secs_f64())
        }));
    }
    start.wait();
    let mut slowest = 0f64;
    for h in fillers {
        slowest = slowest.max(joined(h)?);
    }
    Ok((threads * bytes) as f64 / (1u64 << 30) as f64 / slowest.max(1e-9))
}

fn joined<T>(h: std::thread::JoinHandle<std::io::Result<T>>) -> std::io::Result<T> {
    h.join()
        .map_err(|_| std::io::Error::other("ping-pong thread panicked"))?
}

/// Median of `v` (sorted in place); 0 for none.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median round trip in µs of `rounds` no-op requests to server `index`
/// through `c`, from a thread pinned to `cpu` (None: not pinned).
pub fn rpc_rtt(c: &Client, index: usize, cpu: Option<usize>, rounds: usize) -> Result<f64> {
    let c = c.clone();
    std::thread::spawn(move || -> Result<f64> {
        if let Some(cpu) = cpu {
            chfs_sys::cpu::pin_current_thread(cpu)
                .map_err(|e| BenchError::io("pin thread", "CPU", e))?;
        }
        let mut times = Vec::with_capacity(rounds);
        for i in 0..2 * rounds {
            let t0 = Instant::now();
            c.ping(index)
                .map_err(|e| BenchError::chfs("ping", "server", e))?;
            if i >= rounds {
                times.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(median(&mut times))
    })
    .join()
    .map_err(|_| BenchError::Config("ping thread panicked".into()))?
}

/// The floors of one run, in µs per round trip (medians).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Floors {
    /// 32-byte ping-pong, both threads on one CPU.
    pub unix_same_cpu: f64,
    pub tcp_same_cpu: f64,
    /// Between two CPUs (None on a one-CPU machine).
    pub unix_cross_cpu: Option<f64>,
    pub tcp_cross_cpu: Option<f64>,
    /// A no-op request to a chfsd on this host: on a CPU lane, on the Unix
    /// socket without a lane, over TCP (None: not measured).
    pub rpc_lane: Option<f64>,
    pub rpc_unix: Option<f64>,
    pub rpc_tcp: Option<f64>,
    /// GiB/s that as many Unix socket pairs and TCP connections as the
    /// run has ranks carry at once ([`transport_streams`]; None: not
    /// measured).
    #[serde(default)]
    pub unix_streams: Option<f64>,
    #[serde(default)]
    pub tcp_streams: Option<f64>,
    /// Streams measured at once for those figures.
    #[serde(default)]
    pub stream_pairs: usize,
    /// GiB/s at which as many threads fill fresh memory at once, first
    /// touch, again and on huge pages ([`fresh_memory`]; None: not
    /// measured): the ceiling of writes of new data into a memory store
    /// on this machine.
    #[serde(default)]
    pub fresh_memory: Option<FreshMemory>,
    /// How the ranks reach the pool's first server: "unix" (its Unix
    /// socket on this host) or "tcp" (None: no pool measured).
    #[serde(default)]
    pub pool_path: Option<String>,
}

impl Floors {
    /// Measures the transport floors (no server needed).
    pub fn transports(rounds: usize) -> std::io::Result<Floors> {
        let cpus = cpus_allowed();
        let first = cpus.first().copied();
        let second = cpus.get(1).copied();
        let mut f = Floors {
            unix_same_cpu: transport_rtt(Transport::Unix, first, first, rounds)?,
            tcp_same_cpu: transport_rtt(Transport::Tcp, first, first, rounds)?,
            ..Default::default()
        };
        if second.is_some() {
            f.unix_cross_cpu = Some(transport_rtt(Transport::Unix, first, second, rounds)?);
            f.tcp_cross_cpu = Some(transport_rtt(Transport::Tcp, first, second, rounds)?);
        }
        Ok(f)
    }

    /// Adds the stream ceilings: `pairs` connections at once, for `secs`
    /// each, senders pinned like the ranks.
    pub fn streams(&mut self, pairs: usize, secs: f64) -> std::io::Result<()> {
        let cpus = cpus_allowed();
        let pairs = pairs.max(1);
        self.unix_streams = Some(transport_streams(Transport::Unix, pairs, &cpus, secs)?);
        self.tcp_streams = Some(transport_streams(Transport::Tcp, pairs, &cpus, secs)?);
        self.fresh_memory = Some(fresh_memory(pairs, FRESH_BYTES)?);
        self.stream_pairs = pairs;
        Ok(())
    }

    /// The stream ceiling of the path the pool's ranks take (None: not
    /// measured).
    pub fn pool_streams(&self) -> Option<(&str, f64)> {
        match self.pool_path.as_deref()? {
            "unix" => self.unix_streams.map(|g| ("Unix socket", g)),
            _ => self.tcp_streams.map(|g| ("TCP", g)),
        }
    }

    /// Adds the RPC floors, measured against server `index` of the pool
    /// that `cfg` names (the CPU lane and Unix socket figures only when it
    /// is on this host).
    pub fn rpcs(&mut self, cfg: &ClientConfig, index: usize, rounds: usize) -> Result<()> {
        let cpu = cpus_allowed().first().copied();
        let connect = |local_socket: bool, lanes: CpuLanes| {
            let c = ClientConfig {
                local_socket,
                cpu_lanes: lanes,
                ..cfg.clone()
            };
            Client::connect(c).map_err(|e| BenchError::chfs("connect", "pool", e))
        };
        // The same-host figures only for a server on this host (one it
        // reaches through its Unix socket); a remote one has TCP only.
        let unix = connect(true, CpuLanes::Never)?;
        unix.ping(index)
            .map_err(|e| BenchError::chfs("ping", "server", e))?;
        let local = unix.local_connections().0 > 0;
        self.pool_path = Some(
            if local && cfg.local_socket {
                "unix"
            } else {
                "tcp"
            }
            .to_string(),
        );
        if local {
            self.rpc_unix = Some(rpc_rtt(&unix, index, None, rounds)?);
            let lane = connect(true, CpuLanes::Pinned)?;
            self.rpc_lane = Some(rpc_rtt(&lane, index, cpu, rounds)?);
        }
        let tcp = connect(false, CpuLanes::Never)?;
        self.rpc_tcp = Some(rpc_rtt(&tcp, index, None, rounds)?);
        Ok(())
    }

    /// The floor table.
    pub fn table(&self) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let mut s = String::from("round-trip floor (median us)      same CPU  two CPUs\n");
        s += &format!(
            "  32-byte ping-pong, Unix socket  {:>8}  {:>8}\n",
            f(Some(self.unix_same_cpu)),
            f(self.unix_cross_cpu)
        );
        s += &format!(
            "  32-byte ping-pong, TCP          {:>8}  {:>8}\n",
            f(Some(self.tcp_same_cpu)),
            f(self.tcp_cross_cpu)
        );
        s += &format!(
            "  chfsd no-op: CPU lane {}, Unix socket {}, TCP {}\n",
            f(self.rpc_lane),
            f(self.rpc_unix),
            f(self.rpc_tcp)
        );
        if let (Some(u), Some(t)) = (self.unix_streams, self.tcp_streams) {
            s += &format!(
                "  1 MiB streams, {} at once (GiB/s): Unix socket {u:.2}, TCP {t:.2}\n",
                self.stream_pairs
            );
        }
        if let Some(m) = self.fresh_memory {
            s += &format!(
                "  fresh memory filled, {} at once (GiB/s): first touch {:.2}, again {:.2}, again on huge pages {:.2}\n",
                self.stream_pairs, m.first_touch, m.again, m.huge_pages
            );
        }
        s
    }
}

/// The CPUs this process may run on, in order.
pub fn cpus_allowed() -> Vec<usize> {
    chfs_sys::cpu::allowed().unwrap_or_default()
}

/// `chfs-bench floor`.
#[derive(Args, Debug, Clone)]
pub struct FloorArgs {
    /// Round trips per figure (after as many to warm up).
    #[arg(long, default_value_t = DEFAULT_ROUNDS)]
    pub rounds: usize,
    /// Also the RPC floors against a local pool of one chfsd (started for
    /// the run).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub rpc: bool,
    /// Connections at once for the stream ceilings (0: none measured).
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
}

/// Runs `chfs-bench floor`.
pub fn run(a: &FloorArgs) -> Result<()> {
    let mut f =
        Floors::transports(a.rounds).map_err(|e| BenchError::io("ping-pong", "socket", e))?;
    if a.streams > 0 {
        f.streams(a.streams, STREAM_SECS)
            .map_err(|e| BenchError::io("streams", "socket", e))?;
    }
    if a.rpc {
        let pool = chfs_localpool::LocalPool::start_with(
            chfs_localpool::PoolOptions {
                servers: 1,
                ..Default::default()
            }
            .with_new_secret(),
        )
        .map_err(|e| BenchError::io("start local pool", "chfsd", e))?;
        let cfg = crate::worker::chfs_config(
            &pool.server_string(),
            &crate::worker::PoolCredential::of(&pool),
        )?;
        f.rpcs(&cfg, 0, a.rounds)?;
        pool.stop();
    }
    print!("{}", f.table());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stream moves data, and what the senders wrote is what the
    /// receivers read (or the figure would count bytes nobody received).
    #[test]
    fn streams_carry_data_over_both_transports() {
        for t in [Transport::Unix, Transport::Tcp] {
            let g = transport_streams(t, 2, &cpus_allowed(), 0.2).expect("streams");
            assert!(g > 0.01, "{t:?}: {g} GiB/s");
        }
        let mut f = Floors::default();
        f.streams(1, 0.1).expect("streams");
        assert_eq!(f.stream_pairs, 1);
        assert!(
            f.fresh_memory
                .is_some_and(|m| [m.first_touch, m.again, m.huge_pages]
                    .iter()
                    .all(|g| *g > 0.01 && g.is_finite())),
            "{:?}",
            f.fresh_memory
        );
        assert!(f.pool_streams().is_none(), "no pool was measured");
        f.pool_path = Some("unix".into());
        assert_eq!(f.pool_streams().map(|p| p.0), Some("Unix socket"));
    }
}
