//! Benchmark: a C program writing and reading a file through libchfs vs
//! the same workload through the Rust client, against the same pool in the
//! same run, alternating. Prints MiB/s of each and the ratio C/Rust.
//!
//!     cargo build --release -p chfs-server -p chfs-capi
//!     cargo run --release -p chfs-capi --example capi_bench -- [MiB] [rounds] [servers]
//!
//! Defaults: 1024 MiB, 3 rounds, 2 servers, 1 MiB requests. The library,
//! header and chfs.pc are installed into a temporary PREFIX with
//! scripts/install-capi.sh and the C program is built with pkg-config.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use chfs_client::{Client, ClientConfig};
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
    let client = Client::connect(ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .expect("connect");
    println!(
        "capi_bench: {mib} MiB sequential, {} KiB requests, {servers} servers on loopback, {rounds} rounds (median)",
        REQ >> 10
    );
    let (mut cw, mut cr, mut rw, mut rr) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let out = ok(Command::new(&exe)
            .env("CHFS_SERVER", pool.server_string())
            .args([
                &format!("/bench_c{round}"),
                &mib.to_string(),
                &REQ.to_string(),
            ]));
        let mut it = out.split_whitespace().map(|kv| {
            kv.split_once('=')
                .expect("k=v")
                .1
                .parse::<f64>()
                .expect("number")
        });
        let (tw, tr) = (it.next().expect("write"), it.next().expect("read"));
        cw.push(mib as f64 / tw);
        cr.push(mib as f64 / tr);
        let (tw, tr) = rust_round(&client, &format!("/bench_r{round}"), mib);
        rw.push(mib as f64 / tw);
        rr.push(mib as f64 / tr);
    }
    let (cw, cr, rw, rr) = (median(cw), median(cr), median(rw), median(rr));
    println!("{:<22} {:>12} {:>12}", "", "write MiB/s", "read MiB/s");
    println!("{:<22} {cw:>12.0} {cr:>12.0}", "C via libchfs");
    println!("{:<22} {rw:>12.0} {rr:>12.0}", "Rust chfs_client");
    println!(
        "{:<22} {:>12.3} {:>12.3}",
        "ratio C / Rust",
        cw / rw,
        cr / rr
    );
}
