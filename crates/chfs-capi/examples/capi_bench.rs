//! Benchmark: a C program writing and reading a file through libchfs vs
//! the same workload through the Rust client, against the same pool in the
//! same run, alternating. Prints MiB/s of each and the ratio C/Rust.
//!
//!     cargo build --release -p chfs-server -p chfs-capi
//!     cargo run --release -p chfs-capi --example capi_bench -- [MiB] [rounds] [servers]
//!
//! Defaults: 1024 MiB, 3 rounds, 2 servers, 1 MiB requests. Each side runs
//! in its own fresh process (the Rust side is this program re-executed with
//! `--rust-worker`), so both pay the same start-up costs. The library,
//! header and chfs.pc are installed into a temporary PREFIX with
//! scripts/install-capi.sh and the C program is built with pkg-config.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use chfs_client::Client;
use chfs_localpool::{LocalPool, PoolOptions};

const REQ: usize = 1 << 20;

fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut d = exe.parent().expect("dir").to_path_buf();
    for _ in 0..3 {
        if d.join("libchfs.so").is_file() && d.join("chfsd").is_file() {
            return d;
        }
        d = d.parent().expect("parent").to_path_buf();
    }
    panic!("libchfs.so/chfsd not found: cargo build --release -p chfs-server -p chfs-capi");
}

fn ok(c: &mut Command) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rust_round(c: &Client, path: &str, mib: u64) -> (f64, f64) {
    let buf: Vec<u8> = (0..REQ).map(|i| (i * 31 + 7) as u8).collect();
    let mut back = vec![0u8; REQ];
    let total = mib << 20;
    let t0 = Instant::now();
    let fd = c
        .open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644)
        .expect("create");
    let mut done = 0;
    while done < total {
        assert_eq!(c.write(fd, &buf).expect("write"), REQ);
        done += REQ as u64;
    }
    c.close(fd).expect("close");
    let tw = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let fd = c.open(path, libc::O_RDONLY, 0).expect("open");
    let mut done = 0;
    while done < total {
        let n = c.read(fd, &mut back).expect("read");
        assert!(n > 0);
        done += n as u64;
    }
    c.close(fd).expect("close");
    let tr = t0.elapsed().as_secs_f64();
    assert_eq!(buf, back, "data differs");
    c.unlink(path).expect("unlink");
    (tw, tr)
}

/// CPU seconds (user + system) of the children waited for so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes one `struct rusage` to the pointer given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `capi_bench --rust-worker PATH MIB`: the Rust side in its own process
/// (as the C side is), connected through `CHFS_SERVER`.
fn rust_worker(path: &str, mib: u64) {
    let c = Client::from_env().expect("connect");
    let (tw, tr) = rust_round(&c, path, mib);
    println!("write_s={tw:.6} read_s={tr:.6}");
}

fn parse_times(out: &str) -> (f64, f64) {
    let mut it = out.split_whitespace().map(|kv| {
        kv.split_once('=')
            .expect("k=v")
            .1
            .parse::<f64>()
            .expect("number")
    });
    (it.next().expect("write"), it.next().expect("read"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--rust-worker") {
        rust_worker(&args[1], args[2].parse().expect("MiB"));
        return;
    }
    let mib: u64 = args.first().map_or(1024, |s| s.parse().expect("MiB"));
    let rounds: usize = args.get(1).map_or(3, |s| s.parse().expect("rounds"));
    let servers: usize = args.get(2).map_or(2, |s| s.parse().expect("servers"));
    let dir = build_dir();
    let prefix = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ok(Command::new("bash")
        .arg(root.join("scripts/install-capi.sh"))
        .arg("--from")
        .arg(&dir)
        .arg(prefix.path()));
    let flags = ok(Command::new("pkg-config")
        .args(["--cflags", "--libs", "chfs"])
        .env("PKG_CONFIG_PATH", prefix.path().join("lib/pkgconfig")));
    let exe = prefix.path().join("capi_bench");
    ok(Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/capi_bench.c"))
        .args(flags.split_whitespace()));

    let pool = LocalPool::start_with(PoolOptions {
        servers,
        chfsd: Some(prefix.path().join("bin/chfsd")),
        ..Default::default()
    })
    .expect("pool");
    let me = std::env::current_exe().expect("current_exe");
    println!(
        "capi_bench: {mib} MiB sequential, {} KiB requests, {servers} servers on loopback, {rounds} rounds (median)",
        REQ >> 10
    );
    // The sides: C through libchfs; the same C program with glibc's heap
    // trim threshold fixed (see README: the client's per-chunk buffers make
    // glibc trim and re-fault heap pages in some processes); the Rust client.
    let sides: [(&str, &Path, bool, Option<&str>); 3] = [
        ("C via libchfs", &exe, false, None),
        (
            "C, malloc trim 4 MiB",
            &exe,
            false,
            Some("glibc.malloc.trim_threshold=4194304"),
        ),
        ("Rust chfs_client", &me, true, None),
    ];
    let mut mibs = vec![(Vec::new(), Vec::new()); sides.len()];
    let mut cpu = vec![0.0; sides.len()];
    for round in 0..rounds {
        // Rotate which side goes first, so none always meets a cold server.
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let (_, prog, rust, tunables) = sides[i];
            let path = format!("/bench{i}_{round}");
            let mut cmd = Command::new(prog);
            cmd.env("CHFS_SERVER", pool.server_string());
            if rust {
                cmd.args(["--rust-worker", &path, &mib.to_string()]);
            } else {
                cmd.args([&path, &mib.to_string(), &REQ.to_string()]);
            }
            if let Some(t) = tunables {
                cmd.env("GLIBC_TUNABLES", t);
            }
            let t0 = children_cpu();
            let (tw, tr) = parse_times(&ok(&mut cmd));
            cpu[i] += children_cpu() - t0;
            mibs[i].0.push(mib as f64 / tw);
            mibs[i].1.push(mib as f64 / tr);
        }
    }
    let gib = (mib * rounds as u64) as f64 / 1024.0;
    println!(
        "{:<22} {:>12} {:>12} {:>18}",
        "", "write MiB/s", "read MiB/s", "client CPU s/GiB"
    );
    let med: Vec<(f64, f64)> = mibs
        .into_iter()
        .map(|(w, r)| (median(w), median(r)))
        .collect();
    for (i, (name, ..)) in sides.iter().enumerate() {
        println!(
            "{name:<22} {:>12.0} {:>12.0} {:>18.2}",
            med[i].0,
            med[i].1,
            cpu[i] / (2.0 * gib)
        );
    }
    let rust = med[2];
    println!(
        "{:<22} {:>12.3} {:>12.3}",
        "ratio C / Rust",
        med[0].0 / rust.0,
        med[0].1 / rust.1
    );
    println!(
        "{:<22} {:>12.3} {:>12.3}",
        "ratio C(trim) / Rust",
        med[1].0 / rust.0,
        med[1].1 / rust.1
    );
}
