//! chfind against GNU find over the chfuse mount of the same pool, in the
//! same run: entries/s of each and their ratio.
//!
//! ```text
//! cargo build --release -p chfs-server -p chfs-fuse -p chfs-ctl
//! cargo run --release -p chfs-ctl --example chfind_bench -- [ENTRIES] [SERVERS] [ROUNDS]
//! ```
//! Defaults: 100000 entries, 2 servers, 3 rounds (alternating tools; the
//! median is reported). Needs `chfuse` and `chfind` next to `chfsd`
//! (target/release) and /dev/fuse; without a mount it still reports chfind
//! and GNU find on a local tmpfs copy of the tree.
//!
//! A fifth argument, a list of rank counts (`1,2,3`), also times
//! `mpirun -n R chfind -q` for each R in every round (chfind built with
//! `--features mpi`: `cargo build --release -p chfs-ctl --features mpi`).
//! With CHFIND_BENCH_OTHER=PATH (another chfind build, e.g. an older
//! one), each of those runs is followed by the same with PATH, so the two
//! builds alternate under the same load.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig, TimeSet};
use chfs_localpool::{LocalPool, PoolOptions};

fn arg(i: usize, d: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs `cmd` and returns (elapsed, number of output lines).
fn timed(cmd: &mut Command) -> (Duration, usize) {
    let t = Instant::now();
    let out = cmd.output().expect("run");
    let el = t.elapsed();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    (el, out.stdout.iter().filter(|&&b| b == b'\n').count())
}

/// CPU seconds (user + system) of the process `pid` so far.
fn proc_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime
    // are the 12th and 13th of them.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// CPU seconds of this process's waited-for children (mpirun and, through
/// it, the ranks).
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `ru` is valid for writes.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() {
    let entries = arg(1, 100_000);
    let servers = arg(2, 2);
    let rounds = arg(3, 3).max(1);
    let ranks: Vec<usize> = std::env::args()
        .nth(4)
        .map(|s| s.split(',').filter_map(|r| r.parse().ok()).collect())
        .unwrap_or_default();
    let other: Option<PathBuf> = std::env::var_os("CHFIND_BENCH_OTHER").map(PathBuf::from);
    // Per rank count and build: wall times and the finds' own rates
    // (chfind -v: the slowest rank's time).
    let builds = 1 + other.is_some() as usize;
    let mut t_ranks = vec![vec![Vec::new(); builds]; ranks.len()];
    let mut r_ranks = vec![vec![Vec::new(); builds]; ranks.len()];
    // CPU seconds of a run: the servers' and mpirun's with its ranks'.
    let mut c_ranks = vec![vec![Vec::new(); builds]; ranks.len()];
    let chfsd = chfs_localpool::find_chfsd().expect("chfsd (cargo build --release -p chfs-server)");
    let dir = chfsd.parent().unwrap().to_path_buf();
    let chfind = dir.join("chfind");
    let chfuse = dir.join("chfuse");
    assert!(
        chfind.is_file(),
        "{} missing (cargo build --release -p chfs-ctl)",
        chfind.display()
    );
    let pool = LocalPool::start_with(PoolOptions {
        servers,
        chfsd: Some(chfsd.clone()),
        ..Default::default()
    })
    .expect("pool");
    let c = Client::connect(ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .expect("client");
    let tmp = tempfile::tempdir_in(if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .unwrap();
    let local = tmp.path().join("local");

    // Tree: 100 directories, files spread over them, IO500-like names,
    // one in ten of 3901 bytes, one in five with an old time.
    let ndirs = 100.min(entries / 10).max(1);
    let t = Instant::now();
    c.mkdir("/b", 0o755).unwrap();
    std::fs::create_dir_all(local.join("b")).unwrap();
    for d in 0..ndirs {
        c.mkdir(&format!("/b/d{d}"), 0o755).unwrap();
        std::fs::create_dir(local.join(format!("b/d{d}"))).unwrap();
    }
    let files = entries - ndirs - 1;
    std::thread::scope(|s| {
        for w in 0..4 {
            let c = c.clone();
            let local = local.clone();
            s.spawn(move || {
                for i in (w..files).step_by(4) {
                    let rel = format!("b/d{}/file.mdtest.{i}.{}", i % ndirs, i % 100);
                    let p = format!("/{rel}");
                    let fd = c.create(&p, libc::O_WRONLY, 0o644).unwrap();
                    if i % 10 == 0 {
                        c.ftruncate(fd, 3901).unwrap();
                    }
                    c.close(fd).unwrap();
                    let f = std::fs::File::create(local.join(&rel)).unwrap();
                    if i % 10 == 0 {
                        f.set_len(3901).unwrap();
                    }
                    if i % 5 == 1 || i % 20 == 0 {
                        let old = TimeSet::At(1_700_000_000_000_000_000);
                        c.utimens(&p, old, old).unwrap();
                        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
                            .unwrap();
                    }
                }
            });
        }
    });
    // Reference time stamp: between the old and the new files.
    c.create("/ref", libc::O_WRONLY, 0o644)
        .and_then(|fd| c.close(fd))
        .unwrap();
    let mid = TimeSet::At(1_700_000_100_000_000_000);
    c.utimens("/ref", mid, mid).unwrap();
    let lref = tmp.path().join("ref");
    std::fs::File::create(&lref)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_100))
        .unwrap();
    println!(
        "tree: {entries} entries ({ndirs} directories) on {servers} servers, built in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = chfuse.is_file()
        && Path::new("/dev/fuse").exists()
        && Command::new(&chfuse)
            .arg(&mnt)
            .env("CHFS_SERVER", pool.server_string())
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        println!(
            "(no chfuse mount: {} or /dev/fuse missing, or mount failed)",
            chfuse.display()
        );
    }
    struct Unmount(Option<PathBuf>);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if let Some(m) = &self.0 {
                let _ = Command::new("fusermount3").arg("-u").arg(m).status();
            }
        }
    }
    let _u = Unmount(mounted.then(|| mnt.clone()));

    let io500 = |root: &str, refp: &str| -> Vec<String> {
        [root, "-newer", refp, "-size", "3901c", "-name", "*01*"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let mut t_chfind = Vec::new();
    let mut t_mount = Vec::new();
    let mut t_local = Vec::new();
    let (mut n_chfind, mut n_mount, mut n_local) = (0, 0, 0);
    let mref = mnt.join("ref");
    for r in 0..rounds {
        let (el, n) = timed(
            Command::new(&chfind)
                .args(io500("/b", "/ref"))
                .env("CHFS_SERVER", pool.server_string()),
        );
        t_chfind.push(el);
        n_chfind = n;
        for (k, &nr) in ranks.iter().enumerate() {
            for (b, bin) in std::iter::once(&chfind).chain(&other).enumerate() {
                let server_cpu =
                    || -> f64 { (0..servers).filter_map(|i| pool.pid(i)).map(proc_cpu).sum() };
                let cpu0 = (server_cpu(), children_cpu());
                let t = Instant::now();
                let out = Command::new("mpirun")
                    .args(["--allow-run-as-root", "--oversubscribe", "-n"])
                    .arg(nr.to_string())
                    .args(["-x", "CHFS_SERVER"])
                    .arg(bin)
                    .args(["-q", "-v"])
                    .args(io500("/b", "/ref"))
                    .env("CHFS_SERVER", pool.server_string())
                    .output()
                    .expect("mpirun");
                t_ranks[k][b].push(t.elapsed());
                c_ranks[k][b].push((server_cpu() - cpu0.0, children_cpu() - cpu0.1));
                let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
                let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
                assert!(
                    out.status.success() && got == format!("MATCHED {n_chfind}/{entries}"),
                    "mpirun -n {nr} {} -q: {got:?} {err}",
                    bin.display()
                );
                // "..., 0.123 s, 812345 entries/s, ..." of chfind -v.
                let rate = err
                    .split(", ")
                    .find_map(|f| f.strip_suffix(" entries/s")?.parse::<f64>().ok())
                    .unwrap_or(f64::NAN);
                r_ranks[k][b].push(rate);
                eprintln!(
                    "round {r}: mpirun -n {nr} {} -q {:?} ({err})",
                    bin.display(),
                    t_ranks[k][b][r],
                );
            }
        }
        if mounted {
            let (el, n) = timed(Command::new("find").args(io500(
                mnt.join("b").to_str().unwrap(),
                mref.to_str().unwrap(),
            )));
            t_mount.push(el);
            n_mount = n;
        }
        let (el, n) = timed(Command::new("find").args(io500(
            local.join("b").to_str().unwrap(),
            lref.to_str().unwrap(),
        )));
        t_local.push(el);
        n_local = n;
        eprintln!(
            "round {r}: chfind {:?}, find over mount {:?}, find local {:?}",
            t_chfind[r],
            t_mount.get(r),
            t_local[r]
        );
    }
    assert_eq!(n_chfind, n_local, "chfind and GNU find disagree");
    if mounted {
        assert_eq!(
            n_chfind, n_mount,
            "chfind and GNU find over the mount disagree"
        );
    }
    let rate = |d: Duration| entries as f64 / d.as_secs_f64();
    let tc = median(t_chfind);
    println!("IO500-style query (-newer -size 3901c -name *01*): {n_chfind} matches of {entries}");
    println!(
        "chfind ({servers} servers)                     {:>8.3} s  {:>10.0} entries/s",
        tc.as_secs_f64(),
        rate(tc)
    );
    for (k, &nr) in ranks.iter().enumerate() {
        for (b, bin) in std::iter::once(&chfind).chain(&other).enumerate() {
            let t = median(t_ranks[k][b].clone());
            let mut own = r_ranks[k][b].clone();
            own.sort_by(f64::total_cmp);
            let mut srv: Vec<f64> = c_ranks[k][b].iter().map(|c| c.0).collect();
            let mut cli: Vec<f64> = c_ranks[k][b].iter().map(|c| c.1).collect();
            srv.sort_by(f64::total_cmp);
            cli.sort_by(f64::total_cmp);
            println!(
                "mpirun -n {nr} chfind -q (incl. MPI start) {:>8.3} s  {:>10.0} entries/s; the find (-v) {:>10.0} entries/s (median; min {:.0}, max {:.0}) [{}]",
                t.as_secs_f64(),
                rate(t),
                own[own.len() / 2],
                own[0],
                own[own.len() - 1],
                bin.display()
            );
            println!(
                "    CPU (median): servers {:.3} s, mpirun and its ranks {:.3} s",
                srv[srv.len() / 2],
                cli[cli.len() / 2]
            );
        }
    }
    if mounted {
        let tm = median(t_mount);
        println!(
            "GNU find over the chfuse mount      {:>8.3} s  {:>10.0} entries/s",
            tm.as_secs_f64(),
            rate(tm)
        );
        println!(
            "ratio chfind / GNU find over the mount: {:.2}x",
            rate(tc) / rate(tm)
        );
    }
    let tl = median(t_local);
    println!(
        "GNU find on a local tmpfs copy      {:>8.3} s  {:>10.0} entries/s",
        tl.as_secs_f64(),
        rate(tl)
    );
    println!(
        "ratio chfind / GNU find on tmpfs: {:.2}x",
        rate(tc) / rate(tl)
    );
}
