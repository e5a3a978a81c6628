//! Issue 19's performance targets, measured in one run:
//! 1 MiB sequential write and read, and create/stat/unlink rates, under
//! `LD_PRELOAD=libchfs_preload.so` (a C driver, `preload_bench.c`) against
//! the native client (`chfs_client::Client` in this process), on the same
//! pool of one local `chfsd`; and an open/close loop of a non-chfs-rs file
//! (`/dev/shm`) by the same driver with and without `LD_PRELOAD`.
//!
//! ```sh
//! cargo build --release -p chfs-server --bin chfsd
//! cargo build --release -p chfs-preload
//! cargo run --release -p chfs-preload --example preload_bench [-- MIB FILES OPENS ROUNDS]
//! ```
//! Each figure is the median of ROUNDS rounds (native and preload
//! alternate; which goes first alternates too); "paired" is the median of
//! the rounds' own ratios, with their range. Targets: I/O >= 0.9 of
//! native, metadata >= 0.8, non-chfs-rs open/close at most 5% slower.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use chfs_client::{Client, ClientConfig};
use chfs_localpool::LocalPool;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn driver(lib: Option<&Path>, pool: &LocalPool, exe: &Path, args: &[&str]) -> Vec<f64> {
    let mut c = Command::new(exe);
    c.args(args)
        .env("CHFS_SERVER", pool.server_string())
        .env("CHFS_MOUNTPOINT", "/chfs-bench")
        .env_remove("CHFS_SECRET_FILE")
        .env_remove("LD_PRELOAD");
    if let Some(l) = lib {
        c.env("LD_PRELOAD", l);
    }
    let out = c.output().expect("driver");
    assert!(
        out.status.success(),
        "driver {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// As the driver does before timing.
fn warm_up(c: &Client, path: &str) {
    for _ in 0..1000 {
        let _ = c.stat(path);
    }
}

fn native_io(c: &Client, path: &str, mib: usize) -> (f64, f64) {
    warm_up(c, path);
    let buf: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
    let t = Instant::now();
    let fd = c
        .create(path, libc::O_WRONLY | libc::O_TRUNC, 0o644)
        .unwrap();
    for _ in 0..mib {
        assert_eq!(c.write(fd, &buf).unwrap(), buf.len());
    }
    c.close(fd).unwrap();
    let w = t.elapsed().as_secs_f64();
    let mut back = vec![0u8; 1 << 20];
    let t = Instant::now();
    let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
    for _ in 0..mib {
        assert_eq!(c.read(fd, &mut back).unwrap(), back.len());
    }
    c.close(fd).unwrap();
    (w, t.elapsed().as_secs_f64())
}

fn native_md(c: &Client, dir: &str, n: usize) -> (f64, f64, f64) {
    warm_up(c, dir);
    c.mkdir(dir, 0o755).unwrap();
    let t = Instant::now();
    for i in 0..n {
        let fd = c
            .create(&format!("{dir}/f{i}"), libc::O_WRONLY | libc::O_EXCL, 0o644)
            .unwrap();
        c.close(fd).unwrap();
    }
    let cr = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        c.stat(&format!("{dir}/f{i}")).unwrap();
    }
    let st = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        c.unlink(&format!("{dir}/f{i}")).unwrap();
    }
    (cr, st, t.elapsed().as_secs_f64())
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("MIB FILES OPENS ROUNDS"))
        .collect();
    let mib = a.first().copied().unwrap_or(1024);
    let files = a.get(1).copied().unwrap_or(5000);
    let opens = a.get(2).copied().unwrap_or(200_000);
    let rounds = a.get(3).copied().unwrap_or(7);

    let exe_dir = std::env::current_exe().unwrap();
    let lib: PathBuf = exe_dir
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("libchfs_preload.so"))
        .filter(|p| p.is_file())
        .expect("libchfs_preload.so (cargo build --release -p chfs-preload)");
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("preload_bench_driver");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/preload_bench.c");
    assert!(Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc")
        .success());

    let pool = LocalPool::start(1).expect("chfsd (cargo build --release -p chfs-server)");
    // The same configuration the preload's client gets (from_env).
    let server = pool.server_string();
    let cfg = ClientConfig::from_lookup(|k| match k {
        "CHFS_SERVER" => Some(server.clone()),
        "CHFS_SECRET_FILE" => None,
        _ => std::env::var(k).ok(),
    })
    .unwrap();
    let c = Client::connect(cfg).unwrap();
    let shm = format!("/dev/shm/chfs-preload-bench-{}", std::process::id());
    let (mut nw, mut nr, mut pw, mut pr) = (vec![], vec![], vec![], vec![]);
    let (mut nmd, mut pmd) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
    let (mut plain, mut pre) = (vec![], vec![]);
    for r in 0..rounds {
        // Native first in even rounds, preload first in odd ones.
        let native = |nw: &mut Vec<f64>, nr: &mut Vec<f64>| {
            let (w, rd) = native_io(&c, &format!("/n{r}"), mib);
            nw.push(w);
            nr.push(rd);
            c.unlink(&format!("/n{r}")).unwrap();
        };
        if r % 2 == 0 {
            native(&mut nw, &mut nr);
        }
        let v = driver(
            Some(&lib),
            &pool,
            &exe,
            &["io", &format!("/chfs-bench/p{r}"), &mib.to_string()],
        );
        pw.push(v[0]);
        pr.push(v[1]);
        c.unlink(&format!("/p{r}")).unwrap();
        if r % 2 == 1 {
            native(&mut nw, &mut nr);
        }
        let native_meta = |nmd: &mut [Vec<f64>; 3]| {
            let (cr, st, ul) = native_md(&c, &format!("/nd{r}"), files);
            for (k, x) in [cr, st, ul].into_iter().enumerate() {
                nmd[k].push(x);
            }
        };
        if r % 2 == 0 {
            native_meta(&mut nmd);
        }
        let v = driver(
            Some(&lib),
            &pool,
            &exe,
            &["md", &format!("/chfs-bench/pd{r}"), &files.to_string()],
        );
        for k in 0..3 {
            pmd[k].push(v[k]);
        }
        if r % 2 == 1 {
            native_meta(&mut nmd);
        }
        let openclose = |lib: Option<&Path>| {
            driver(lib, &pool, &exe, &["openclose", &shm, &opens.to_string()])[0]
        };
        if r % 2 == 0 {
            plain.push(openclose(None));
            pre.push(openclose(Some(&lib)));
        } else {
            pre.push(openclose(Some(&lib)));
            plain.push(openclose(None));
        }
    }
    let _ = std::fs::remove_file(&shm);

    // Each round measures both sides within a few seconds of each other:
    // the median of the rounds' own ratios is what a shared, busy host
    // disturbs least (a slow round slows both sides); the ratio of the
    // medians and the rounds' lowest and highest ratio are shown too.
    let paired = |n: &[f64], p: &[f64]| -> (f64, f64, f64) {
        // Times: native / preload is the preload's rate over the native.
        let r: Vec<f64> = n.iter().zip(p).map(|(a, b)| a / b).collect();
        let lo = r.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = r.iter().cloned().fold(0.0, f64::max);
        (median(r), lo, hi)
    };
    println!("pool: 1 local chfsd (mem), default chunk size; {rounds} rounds");
    println!(
        "{:<34} {:>12} {:>12} {:>7} {:>7} {:>13}  target",
        "", "native", "preload", "ratio", "paired", "rounds"
    );
    let row = |name: &str, unit: &str, n: f64, p: f64, pr: (f64, f64, f64), target: &str| {
        println!(
            "{name:<34} {:>8.0} {unit} {:>8.0} {unit} {:>7.3} {:>7.3} {:>6.2}-{:<6.2}  {target}",
            n,
            p,
            p / n,
            pr.0,
            pr.1,
            pr.2
        );
    };
    let mb = mib as f64;
    row(
        &format!("write {mib} MiB, 1 MiB records"),
        "MiB/s",
        mb / median(nw.clone()),
        mb / median(pw.clone()),
        paired(&nw, &pw),
        ">= 0.9",
    );
    row(
        &format!("read {mib} MiB, 1 MiB records"),
        "MiB/s",
        mb / median(nr.clone()),
        mb / median(pr.clone()),
        paired(&nr, &pr),
        ">= 0.9",
    );
    for (k, name) in ["create+close", "stat", "unlink"].into_iter().enumerate() {
        let n = files as f64 / median(nmd[k].clone());
        let p = files as f64 / median(pmd[k].clone());
        row(
            &format!("{name} ({files} files)"),
            "op/s ",
            n,
            p,
            paired(&nmd[k], &pmd[k]),
            ">= 0.8",
        );
    }
    // Here the ratio is of times: preload / without.
    let (a, b) = (median(plain.clone()), median(pre.clone()));
    let (r, lo, hi) = paired(&pre, &plain);
    println!(
        "{:<34} {:>5.1} ns/op {:>5.1} ns/op {:>7.3} {:>7.3} {:>6.2}-{:<6.2}  <= 1.05 (time, preload / without)",
        format!("open+close /dev/shm, {opens}x"),
        a / opens as f64 * 1e9,
        b / opens as f64 * 1e9,
        b / a,
        r,
        lo,
        hi
    );
}
