//! Engines measured through real `chfsd` servers (what a client sees), and
//! the POSIX engine's server memory while a large volume passes through.
//!
//! ```text
//! cargo build --release -p chfs-server
//! cargo run --release -p chfs-store --example server_bench -- engines [MIB] [FILES] [ROUNDS]
//! cargo run --release -p chfs-store --example server_bench -- rss [GIB] [DIR]
//! ```
//!
//! `engines`: one server per engine (mem, pmem on /dev/shm, posix on
//! /dev/shm, posix on the temp directory), alternating rounds; a client
//! writes and reads a MIB-MiB file (1 MiB chunks, fsync), then creates,
//! stats and removes FILES empty files. Prints the medians and the ratio to
//! the mem engine of the same run.
//!
//! `rss`: one POSIX-engine server with its store in DIR (default the temp
//! directory); GIB GiB are written (1 MiB chunks, 256 MiB files, fsync),
//! read back and removed; the server's VmRSS is sampled throughout.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};

struct Server {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(store: &str, parent: &Path, size: &str) -> Server {
    let dir = tempfile::tempdir_in(parent).expect("scratch dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let info = dir.path().join("addr");
    let path = match store {
        "pmem" => dir.path().join("s.pmem"),
        _ => dir.path().join("s"),
    };
    let chfsd = chfs_localpool::find_chfsd().expect("chfsd (cargo build --release -p chfs-server)");
    let mut child = Command::new(chfsd)
        .args([
            "--host",
            &addr,
            "--store",
            store,
            "--size",
            size,
            "--log-level",
            "warn",
        ])
        .arg("--path")
        .arg(&path)
        .arg("-S")
        .arg(&info)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn chfsd");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&info).is_ok_and(|s| s.ends_with('\n')) {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("chfsd exited: {st}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "chfsd did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Server {
        child,
        addr,
        _dir: dir,
    }
}

fn client(s: &Server) -> Client {
    let c = Client::connect(ClientConfig {
        servers: vec![s.addr.clone()],
        rpc_timeout: Duration::from_secs(60),
        ..Default::default()
    })
    .unwrap();
    c.set_chunk_size(1 << 20).unwrap();
    c
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn engines(mib: usize, files: usize, rounds: usize) {
    let shm = PathBuf::from("/dev/shm");
    let disk = std::env::temp_dir();
    let list: Vec<(&str, String, PathBuf)> = vec![
        ("mem", "mem".into(), disk.clone()),
        ("pmem", format!("pmem ({})", shm.display()), shm.clone()),
        ("posix", format!("posix ({})", shm.display()), shm.clone()),
        ("posix", format!("posix ({})", disk.display()), disk.clone()),
    ];
    let block: Vec<u8> = (0..(4usize << 20)).map(|i| (i * 7) as u8).collect();
    let mut res: Vec<Vec<[f64; 5]>> = list.iter().map(|_| Vec::new()).collect();
    let size = format!("{}M", mib * 2 + 64 + files / 512);
    for _ in 0..rounds {
        for (i, (store, _, dir)) in list.iter().enumerate() {
            let s = start(store, dir, if *store == "pmem" { &size } else { "0" });
            let c = client(&s);
            let t0 = Instant::now();
            let fd = c.create("/big", libc::O_WRONLY, 0o644).unwrap();
            let mut off = 0u64;
            while off < (mib as u64) << 20 {
                c.pwrite(fd, &block, off).unwrap();
                off += block.len() as u64;
            }
            c.fsync(fd).unwrap();
            c.close(fd).unwrap();
            let w = off as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
            let t0 = Instant::now();
            let fd = c.open("/big", libc::O_RDONLY, 0).unwrap();
            let mut buf = vec![0u8; block.len()];
            let mut got = 0u64;
            while got < off {
                got += c.pread(fd, &mut buf, got).unwrap() as u64;
            }
            c.close(fd).unwrap();
            let r = got as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64;
            c.unlink("/big").unwrap();
            c.mkdir("/m", 0o755).unwrap();
            let t0 = Instant::now();
            for k in 0..files {
                let fd = c
                    .create(&format!("/m/f{k}"), libc::O_WRONLY, 0o644)
                    .unwrap();
                c.close(fd).unwrap();
            }
            let cr = files as f64 / t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            for k in 0..files {
                c.stat(&format!("/m/f{k}")).unwrap();
            }
            let st = files as f64 / t0.elapsed().as_secs_f64();
            let t0 = Instant::now();
            for k in 0..files {
                c.unlink(&format!("/m/f{k}")).unwrap();
            }
            let rm = files as f64 / t0.elapsed().as_secs_f64();
            res[i].push([w, r, cr, st, rm]);
        }
    }
    println!("through chfsd (1 server, 1 client, loopback): {mib} MiB file in 1 MiB chunks + fsync, {files} files, {rounds} rounds (median)");
    let heads = [
        "write MiB/s",
        "read MiB/s",
        "create/s",
        "stat/s",
        "unlink/s",
    ];
    print!("{:<22}", "engine");
    for h in heads {
        print!("{h:>18}");
    }
    println!();
    let med = |i: usize, k: usize| median(res[i].iter().map(|f| f[k]).collect());
    for (i, (_, name, _)) in list.iter().enumerate() {
        print!("{name:<22}");
        for k in 0..5 {
            let v = med(i, k);
            print!("{:>18}", format!("{v:.0} ({:.0}%)", 100.0 * v / med(0, k)));
        }
        println!();
    }
    println!("(percentages: ratio to the mem engine measured in the same run)");
}

fn rss(gib: u64, dir: PathBuf) {
    let s = start("posix", &dir, "0");
    let c = client(&s);
    let pid = s.child.id();
    let block: Vec<u8> = (0..(4usize << 20)).map(|i| (i * 13) as u8).collect();
    let file_bytes = 256u64 << 20;
    let files = (gib << 30) / file_bytes;
    // Warm-up file, then the baseline.
    let fd = c.create("/warm", libc::O_WRONLY, 0o644).unwrap();
    for k in 0..16u64 {
        c.pwrite(fd, &block, k * block.len() as u64).unwrap();
    }
    c.close(fd).unwrap();
    c.unlink("/warm").unwrap();
    let base = rss_kib(pid);
    let mut peak = base;
    let t0 = Instant::now();
    let mut buf = vec![0u8; block.len()];
    for f in 0..files {
        let p = format!("/stream{f}");
        let fd = c.create(&p, libc::O_WRONLY, 0o644).unwrap();
        let mut off = 0;
        while off < file_bytes {
            c.pwrite(fd, &block, off).unwrap();
            off += block.len() as u64;
            peak = peak.max(rss_kib(pid));
        }
        c.fsync(fd).unwrap();
        c.close(fd).unwrap();
        let fd = c.open(&p, libc::O_RDONLY, 0).unwrap();
        let mut got = 0;
        while got < file_bytes {
            let n = c.pread(fd, &mut buf, got).unwrap();
            assert!(n > 0);
            assert!(buf[..n] == block[..n], "data mismatch");
            got += n as u64;
            peak = peak.max(rss_kib(pid));
        }
        c.close(fd).unwrap();
        c.unlink(&p).unwrap();
        if f % 8 == 7 {
            println!(
                "  {:>5} MiB through, RSS {} KiB (peak {peak} KiB)",
                (f + 1) * (file_bytes >> 20),
                rss_kib(pid)
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let total = files * file_bytes;
    println!(
        "posix engine in {}: {} MiB written, read back and removed in {secs:.1} s ({:.0} MiB/s of file data moved); chfsd RSS base {base} KiB, peak {peak} KiB, growth {} KiB",
        dir.display(),
        total >> 20,
        (2 * (total >> 20)) as f64 / secs,
        peak - base
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("rss") => rss(
            num(1, 10),
            args.get(2)
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
        ),
        Some("engines") | None => engines(
            num(1, 256) as usize,
            num(2, 5000) as usize,
            num(3, 3) as usize,
        ),
        Some(other) => {
            eprintln!("unknown mode {other:?}: engines [MIB] [FILES] [ROUNDS] | rss [GIB] [DIR]");
            std::process::exit(2);
        }
    }
}
