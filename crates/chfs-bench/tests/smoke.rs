//! Smoke runs of the real binary: every phase with tiny sizes against a
//! local pool of real chfsd servers and a reference directory, checking the
//! JSON result; the pool's parallel find against an independent walk; the
//! bandwidth sweep; bad input.
//!
//! Needs `chfsd` built (`cargo build -p chfs-server`).

use std::path::Path;
use std::process::Command;

use chfs_bench::fs::{Backend, ChfsBackend, FindResult};
use chfs_bench::pattern::{FindSpec, Phase, MD_HARD_SIZE};
use chfs_bench::report::RunResult;
use chfs_client::{Client, ClientConfig};
use chfs_localpool::LocalPool;

const BIN: &str = env!("CARGO_BIN_EXE_chfs-bench");

/// A scratch directory on /dev/shm if there is one (the usual reference).
fn scratch() -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    if base.is_dir() {
        tempfile::tempdir_in(base).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

const TINY: &[&str] = &[
    "--quick",
    "--stonewall",
    "5",
    "--transfer",
    "65536",
    "--easy-segments",
    "6",
    "--hard-records",
    "5",
    "--easy-files",
    "40",
    "--hard-files",
    "120",
    "--no-progress",
];

fn run_bench(args: &[&str]) -> (RunResult, String) {
    let out = Command::new(BIN)
        .args(args)
        .args(TINY)
        .env_remove("CHFS_SERVER")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chfs-bench failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let i = args.iter().position(|a| *a == "--json").unwrap();
    let json = std::fs::read_to_string(args[i + 1]).unwrap();
    (serde_json::from_str(&json).unwrap(), stdout)
}

/// Every phase present, valid, and moving what the sizes imply.
fn check_target(t: &chfs_bench::report::TargetResult, nprocs: usize) {
    let names: Vec<&str> = t.phases.iter().map(|p| p.name.as_str()).collect();
    let want: Vec<&str> = Phase::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(names, want);
    let get = |n: &str| t.phases.iter().find(|p| p.name == n).unwrap();
    for p in &t.phases {
        assert!(p.valid, "{} invalid: {p:?}", t.label);
        assert!(p.rate > 0.0 && p.secs > 0.0, "{p:?}");
        assert!(p.items > 0, "{p:?}");
    }
    // tiny maxima, generous stonewall: every rank reaches its maximum
    let n = nprocs as u64;
    assert_eq!(get("ior-easy-write").items, 6 * n);
    assert_eq!(get("ior-easy-write").bytes, 6 * n * 65536);
    assert_eq!(get("ior-easy-read").bytes, 6 * n * 65536);
    assert_eq!(get("ior-hard-write").bytes, 5 * n * 47008);
    assert_eq!(get("ior-hard-read").bytes, 5 * n * 47008);
    for ph in [
        "mdtest-easy-write",
        "mdtest-easy-stat",
        "mdtest-easy-delete",
    ] {
        assert_eq!(get(ph).items, 40 * n, "{ph}");
        assert_eq!(get(ph).per_rank, vec![40; nprocs], "{ph}");
    }
    for ph in [
        "mdtest-hard-write",
        "mdtest-hard-stat",
        "mdtest-hard-read",
        "mdtest-hard-delete",
    ] {
        assert_eq!(get(ph).items, 120 * n, "{ph}");
    }
    assert_eq!(get("mdtest-hard-read").bytes, 120 * n * MD_HARD_SIZE as u64);
    // tiny maxima: every write phase ran out of items before the
    // stonewall, and every ior phase moved less than 1 GiB per rank
    for p in &t.phases {
        let short = p.warnings.iter().any(|w| w.contains("ran out of items"));
        let small = p.warnings.iter().any(|w| w.contains("less than 1 GiB"));
        assert_eq!(short, p.name.ends_with("-write"), "{p:?}");
        assert_eq!(small, p.name.starts_with("ior-"), "{p:?}");
    }
    // find: file.mdtest.<r>.<i> for i < 120 contains "01" only at i = 101
    // (and for rank 0 nothing else) -> one per rank
    assert_eq!(t.find.expected, n);
    assert_eq!(t.find.found, n);
    // examined: all entries of the tree (4 top dirs, n rank dirs, 2 ior
    // files + n easy files, 40n + 120n md files)
    assert_eq!(t.find.examined, 4 + n + (1 + n) + 40 * n + 120 * n);
    assert_eq!(get("find").items, t.find.examined);
    assert!(t.score.score > 0.0 && t.score.bandwidth_gib_s > 0.0 && t.score.metadata_kiops > 0.0);
    assert_eq!(t.open_storm.ranks, nprocs);
    assert!(t.open_storm.max_secs >= t.open_storm.min_secs && t.open_storm.min_secs > 0.0);
}

#[test]
fn pool_and_reference_smoke() {
    let refdir = scratch();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("r.json");
    let svg = out.path().join("r.svg");
    let (run, stdout) = run_bench(&[
        "--servers",
        "2",
        "-n",
        "3",
        "--reference",
        refdir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(run.params.nprocs, 3);
    // The local pool has a secret: its ranks got in with its client key.
    assert!(
        matches!(
            &run.system.target,
            chfs_bench::worker::TargetSpec::Chfs {
                credential: chfs_bench::worker::PoolCredential::File(k),
                ..
            } if k.ends_with("chfs.client.key")
        ),
        "{:?}",
        run.system.target
    );
    check_target(&run.system, 3);
    let r = run.reference.as_ref().expect("reference");
    check_target(r, 3);
    // The pool's servers' CPU time per item of every phase; none for the
    // directory.
    for p in &run.system.phases {
        assert!(p.server_cpu_us.is_some_and(|us| us > 0.0), "{p:?}");
    }
    assert!(r.phases.iter().all(|p| p.server_cpu_us.is_none()));
    assert!(
        stdout.contains(
            "server CPU, us per item (transfer, record, file; all servers): system ior-easy-write "
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("all servers): reference"), "{stdout}");
    assert_eq!(run.ratios.len(), 15);
    assert!(run.ratios.iter().all(|x| x.ratio > 0.0));
    assert!(!run.host.is_empty() && !run.version.is_empty());
    assert!(
        run.command.iter().any(|a| a == "--reference"),
        "{:?}",
        run.command
    );
    for p in Phase::ALL {
        assert!(stdout.contains(p.name()), "{stdout}");
    }
    assert!(stdout.contains("[SCORE] score"), "{stdout}");
    let s = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(s.matches(r#"class="ref""#).count(), 15);
    // the benchmark cleaned up after itself in the reference directory
    assert_eq!(std::fs::read_dir(refdir.path()).unwrap().count(), 0);
}

/// The benchmark over a local pool whose servers speak libfabric's tcp
/// provider (`--protocol ofi+tcp`): every phase runs through the fabric.
#[test]
fn pool_over_ofi_tcp_smoke() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "pool_over_ofi_tcp_smoke",
            "built without libfabric",
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("r.json");
    let (run, _) = run_bench(&[
        "--servers",
        "2",
        "--protocol",
        "ofi+tcp",
        "-n",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    match &run.system.target {
        chfs_bench::worker::TargetSpec::Chfs { servers, .. } => {
            assert!(servers.starts_with("ofi+tcp://"), "{servers}")
        }
        other => panic!("{other:?}"),
    }
    check_target(&run.system, 2);
}

#[test]
fn one_engine_against_another() {
    // The pmem engine against the DRAM engine, each in its own pool; the
    // servers' own status says which engine served which side.
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("e.json");
    let (run, stdout) = run_bench(&[
        "--servers",
        "2",
        "-n",
        "2",
        "--store",
        "pmem",
        "--store-size",
        "64M",
        "--reference-store",
        "mem",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("system: chfs-rs pool of 2 servers, store pmem"),
        "{stdout}"
    );
    assert!(
        stdout.contains("reference: chfs-rs pool of 2 servers, store mem"),
        "{stdout}"
    );
    // Both pools report their servers' CPU time.
    for t in ["system", "reference"] {
        assert!(
            stdout.contains(&format!("all servers): {t} ior-easy-write ")),
            "{stdout}"
        );
    }
    check_target(&run.system, 2);
    let r = run.reference.as_ref().expect("reference");
    assert!(matches!(
        r.target,
        chfs_bench::worker::TargetSpec::Chfs { .. }
    ));
    check_target(r, 2);
    assert_eq!(run.ratios.len(), 15);
    assert!(run.ratios.iter().all(|x| x.ratio > 0.0));
}

#[test]
fn a_pool_with_a_secret_needs_its_key() {
    let pool = LocalPool::start_with(
        chfs_localpool::PoolOptions {
            servers: 2,
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd (cargo build -p chfs-server)");
    let key = pool.client_key_file().unwrap();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("k.json");
    let bench = |key: Option<&Path>| {
        let mut c = Command::new(BIN);
        c.args(["-n", "2", "--json", json.to_str().unwrap()])
            .args(TINY)
            .env("CHFS_SERVER", pool.server_string())
            .env_remove("CHFS_SECRET")
            .env_remove("CHFS_SECRET_FILE");
        if let Some(k) = key {
            c.env("CHFS_SECRET_FILE", k);
        }
        c.output().unwrap()
    };
    let o = bench(None);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("EACCES") && err.contains("CHFS_SECRET_FILE"),
        "{err}"
    );
    let o = bench(Some(&key));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let run: RunResult = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_target(&run.system, 2);

    // A local pool without a secret: a warning, and the run goes on.
    let o = Command::new(BIN)
        .args(["sweep", "--servers", "1", "--no-secret"])
        .args(["--chunk-sizes", "65536", "--request-sizes", "65536"])
        .args(["--file-mib", "1", "--reps", "1"])
        .env_remove("CHFS_SERVER")
        .env("CHFS_SECRET_FILE", "/stale/key")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("open to every local and remote process"),
        "{err}"
    );
}

#[test]
fn posix_only_smoke() {
    let dir = scratch();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("p.json");
    let (run, _) = run_bench(&[
        "--posix",
        dir.path().to_str().unwrap(),
        "-n",
        "3",
        "--shift",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(run.params.shift, 2);
    check_target(&run.system, 3);
    assert!(run.reference.is_none() && run.ratios.is_empty());
    assert!(run.system.phases.iter().all(|p| p.server_cpu_us.is_none()));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// `--quick` alone: the CI sizes, a per-second series for every phase
/// but find that adds up to the phase, and the warnings of a short run.
#[test]
fn quick_run_has_series_and_warnings() {
    let dir = scratch();
    let out = tempfile::tempdir().unwrap();
    let (json, svg) = (out.path().join("q.json"), out.path().join("q.svg"));
    let o = Command::new(BIN)
        .args(["--posix", dir.path().to_str().unwrap(), "-n", "2"])
        .args([
            "--quick",
            "--prefault",
            "--no-floor",
            "--no-progress",
            "--json",
        ])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let run: RunResult = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(run.params.stonewall_secs, 1.0);
    assert_eq!(run.params.easy_max_segments, 256);
    assert_eq!(run.params.md_hard_max, 10000);
    // --prefault: each rank wrote (and deleted) what it could write, at
    // most 256 MiB + 2000 records + 10000 files
    assert!(run.params.prefault);
    let pf = run.system.prefault.expect("prefault in the JSON");
    assert!(
        pf.bytes_per_rank > 0
            && pf.bytes_per_rank <= (256 << 20) + 2000 * 47008 + 10000 * MD_HARD_SIZE as u64,
        "{pf:?}"
    );
    assert!(stdout.contains("prefault: system: touched"), "{stdout}");
    for p in &run.system.phases {
        assert!(p.valid, "{p:?}");
        if p.name == "find" {
            assert!(p.series.is_empty());
            continue;
        }
        assert!(!p.series.is_empty(), "{p:?}");
        assert!(p.series.len() as f64 <= p.secs.ceil() + 1.0, "{p:?}");
        let items: u64 = p.series.iter().map(|x| x.items).sum();
        let bytes: u64 = p.series.iter().map(|x| x.bytes).sum();
        assert_eq!((items, bytes), (p.items, p.bytes), "{}", p.name);
        assert!(p.series.iter().any(|x| x.rate > 0.0), "{p:?}");
        // at most 256 MiB per rank: every ior phase is too small
        if p.name.starts_with("ior-") {
            assert!(
                p.warnings.iter().any(|w| w.contains("less than 1 GiB")),
                "{p:?}"
            );
            assert!(
                stdout.contains(&format!("warning: system {}: moved", p.name)),
                "{stdout}"
            );
        }
        // a write phase was stopped by the stonewall or says it was not
        if p.name.ends_with("-write") {
            let short = p.warnings.iter().any(|w| w.contains("ran out of items"));
            assert_eq!(short, !p.stonewalled, "{p:?}");
        }
    }
    let s = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(s.matches(r#"class="series-sys""#).count(), 11);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// An independent walk of the pool: plain recursive `readdir`.
fn walk(c: &Client, dir: &str, rel: &str, spec: &FindSpec, out: &mut FindResult) {
    for e in c.readdir(dir).unwrap() {
        out.examined += 1;
        let r = if rel.is_empty() {
            e.name.clone()
        } else {
            format!("{rel}/{}", e.name)
        };
        if e.stat.is_dir() {
            walk(c, &format!("{dir}/{}", e.name), &r, spec, out);
        } else if spec.matches(&e.name, e.stat.mtime, e.stat.size) {
            out.matched.push(r);
        }
    }
}

#[test]
fn pool_find_agrees_with_an_independent_walk() {
    let pool = LocalPool::start(3).expect("start chfsd (cargo build -p chfs-server)");
    let cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    };
    let c = Client::connect(cfg).unwrap();
    let fs = ChfsBackend::new(c.clone(), "/t");
    fs.mkdir("").unwrap();
    let data = vec![1u8; MD_HARD_SIZE];
    for d in ["a", "a/b", "c", "c/d01", "c/d01/e"] {
        fs.mkdir(d).unwrap();
    }
    for d in ["", "a", "a/b", "c", "c/d01", "c/d01/e"] {
        for i in 0..110u64 {
            let p = if d.is_empty() {
                format!("f.{i}")
            } else {
                format!("{d}/f.{i}")
            };
            let mut f = fs.create(&p).unwrap();
            let len = if i % 4 == 0 { 1 } else { data.len() };
            f.pwrite_all(&data[..len], 0).unwrap();
            f.close().unwrap();
        }
    }
    let spec = FindSpec::io500(0);
    let mut want = FindResult::default();
    walk(&c, "/t", "", &spec, &mut want);
    want.matched.sort();
    assert_eq!(want.examined, 5 + 6 * 110);
    assert!(!want.matched.is_empty());
    let got = fs.find("", &spec, 1).unwrap();
    assert_eq!(got, want);
    // newer than now: nothing matches, everything is still examined
    let got = fs.find("", &FindSpec::io500(i64::MAX), 1).unwrap();
    assert!(got.matched.is_empty());
    assert_eq!(got.examined, want.examined);
    fs.remove_all("").unwrap();
    assert!(c.stat("/t").is_err());
}

#[test]
fn sweep_smoke() {
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("s.json");
    let o = Command::new(BIN)
        .args(["sweep", "--servers", "2", "--chunk-sizes", "4096,65536"])
        .args([
            "--request-sizes",
            "4096,262144",
            "--file-mib",
            "1",
            "--json",
        ])
        .arg(&json)
        .env_remove("CHFS_SERVER")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pts: Vec<chfs_bench::sweep::SweepPoint> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(pts.len(), 4);
    for p in &pts {
        assert_eq!(p.file_bytes, 1 << 20);
        assert!(
            p.pipelined_write_mib_s > 0.0 && p.sequential_read_mib_s > 0.0,
            "{p:?}"
        );
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("pipelined / sequential"), "{stdout}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let run = |args: &[&str]| {
        let o = Command::new(BIN)
            .args(args)
            .env_remove("CHFS_SERVER")
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(run(&[]).contains("CHFS_SERVER"));
    assert!(run(&["--posix", "/nonexistent/chfs-bench"]).contains("not a directory"));
    assert!(run(&["--posix", "/tmp", "-n", "0"]).contains("--procs"));
    assert!(run(&["--posix", "/tmp", "--stonewall=-1"]).contains("--stonewall"));
    assert!(run(&["--posix", "/tmp", "--hard-files", "0"]).contains("--hard-files"));
    // an engine needs a local pool; one reference at a time
    assert!(run(&["--store", "pmem"]).contains("--servers"));
    assert!(run(&["--servers", "2", "--store", "dram"]).contains("possible values"));
    let e = run(&[
        "--servers",
        "2",
        "--reference",
        "/tmp",
        "--reference-store",
        "mem",
    ]);
    assert!(e.contains("cannot be used with"), "{e}");
    // a pool that is not there: an error naming the address, no hang
    let e = run(&["--no-progress"]);
    assert!(e.contains("CHFS_SERVER"), "{e}");
    let o = Command::new(BIN)
        .args(["--quick", "--no-progress", "--stonewall", "0"])
        .env("CHFS_SERVER", "127.0.0.1:9")
        .env("CHFS_RPC_TIMEOUT_MSEC", "2000")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("127.0.0.1:9"));
}

#[test]
fn sigterm_stops_the_run_and_cleans_up() {
    let dir = scratch();
    let child = Command::new(BIN)
        .args([
            "--posix",
            dir.path().to_str().unwrap(),
            "-n",
            "2",
            "--no-progress",
        ])
        .args([
            "--quick",
            "--stonewall",
            "60",
            "--easy-segments",
            "100000000",
            "--transfer",
            "4096",
        ])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // wait until the benchmark directory exists (the run has started)
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(dir.path()).unwrap().count() == 0 {
        assert!(t0.elapsed().as_secs() < 20, "run did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: kill(2) on the PID of the child this test spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t1 = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t1.elapsed().as_secs() < 10, "took {:?}", t1.elapsed());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left files behind"
    );
}

#[test]
fn a_dead_server_fails_the_run_with_a_clear_error() {
    let mut pool = LocalPool::start(2).expect("start chfsd (cargo build -p chfs-server)");
    let cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    };
    let c = Client::connect(cfg).unwrap();
    let child = Command::new(BIN)
        .args(["-n", "2", "--quick", "--no-progress", "--stonewall", "30"])
        .args(["--easy-segments", "100000000", "--transfer", "65536"])
        .env("CHFS_SERVER", pool.server_string())
        .env("CHFS_RPC_TIMEOUT_MSEC", "3000")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while c.readdir("/").map(|v| v.is_empty()).unwrap_or(true) {
        assert!(t0.elapsed().as_secs() < 20, "run did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    pool.kill(1);
    let out = child.wait_with_output().unwrap();
    assert!(t0.elapsed().as_secs() < 30, "took {:?}", t0.elapsed());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chfs-bench: worker"), "{err}");
    assert!(err.contains("ior-easy/file."), "{err}");
}

/// `--bind-to core` (the default for no more ranks than CPUs) runs each
/// rank on one CPU, as `mpirun` binds ranks; `none` does not; the JSON and
/// the report say which. A worker given a CPU is pinned to it before it
/// does anything (its `Cpus_allowed_list` while it waits for work).
#[test]
fn ranks_are_bound_to_cpus_as_mpirun_binds_them() {
    let dir = scratch();
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("b.json");
    let posix = ["--posix", dir.path().to_str().unwrap(), "-n", "2"];
    let (run, stdout) = run_bench(&[&posix[..], &["--json", json.to_str().unwrap()]].concat());
    let cpus = chfs_sys::cpu::allowed_count().unwrap();
    assert_eq!(
        run.params.bind,
        2 <= cpus,
        "default binding with {cpus} CPUs"
    );
    let (run, stdout_core) = run_bench(
        &[
            &posix[..],
            &["--bind-to", "core", "--json", json.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(run.params.bind);
    assert!(
        stdout_core.contains("ranks 2 (one CPU each)"),
        "{stdout_core}"
    );
    check_target(&run.system, 2);
    let (run, stdout_none) = run_bench(
        &[
            &posix[..],
            &["--bind-to", "none", "--json", json.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(!run.params.bind);
    assert!(stdout_none.contains("ranks 2  stonewall"), "{stdout_none}");
    drop(stdout);

    // The worker itself: pinned to the CPU it is given.
    let cpu = *chfs_sys::cpu::allowed().unwrap().last().unwrap();
    let mut w = Command::new(BIN)
        .arg(chfs_bench::leader::WORKER_ARG)
        .env(chfs_bench::worker::PIN_VAR, cpu.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", w.id());
    let t = std::time::Instant::now();
    let allowed = loop {
        let s = std::fs::read_to_string(&status).unwrap();
        let l = s
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        if l == cpu.to_string() || t.elapsed() > std::time::Duration::from_secs(5) {
            break l;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(w.stdin.take());
    let _ = w.wait();
    assert_eq!(allowed, cpu.to_string());
}
