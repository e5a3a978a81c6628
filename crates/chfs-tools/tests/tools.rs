//! The cache tools against a real pool with a backend directory.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use chfs_localpool::{LocalPool, PoolOptions};

#[test]
fn stagein_from_stdin_then_flush_status_and_wait() {
    let backend = std::env::temp_dir().join(format!("chfs-tools-{}", std::process::id()));
    let _ = fs::remove_dir_all(&backend);
    fs::create_dir_all(backend.join("data")).unwrap();
    for i in 0..20 {
        fs::write(
            backend.join(format!("data/f{i}")),
            vec![i as u8; 10_000 + i * 100],
        )
        .unwrap();
    }
    let args = vec![
        "--backend".into(),
        backend.display().to_string(),
        "--flush-idle-msec".into(),
        "60000".into(),
    ];
    let pool = LocalPool::start_with(PoolOptions {
        servers: 2,
        args,
        ..Default::default()
    })
    .unwrap();
    let env = [("CHFS_SERVER", pool.server_string())];
    let mut child = Command::new(env!("CARGO_BIN_EXE_chstagein"))
        .arg("-v")
        .envs(env.clone())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let list: String = (0..20).map(|i| format!("/data/f{i}\n")).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("20 paths"), "{err}");
    let chfs = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_chfs"))
            .args(args)
            .envs(env.clone())
            .output()
            .unwrap()
    };
    // A write through the library, then status, then wait.
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap();
    let fd = c.open("/data/f3", libc::O_WRONLY, 0).unwrap();
    c.pwrite(fd, b"changed", 0).unwrap();
    c.close(fd).unwrap();
    let out = chfs(&["flush-status", "/data"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !s.contains(": 0 dirty chunks"),
        "{s}"
    );
    let out = chfs(&["flush-wait", "/data", "--timeout", "30"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&fs::read(backend.join("data/f3")).unwrap()[..7], b"changed");
    let out = chfs(&["flush-status"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(": 0 dirty chunks"));
    let out = Command::new(env!("CARGO_BIN_EXE_chstagein"))
        .arg("/nope")
        .envs(env)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nope"));
    drop(pool);
    let _ = fs::remove_dir_all(&backend);
}

/// `mpirun -n 3 chstagein DIR`: every rank stages its share of the files
/// below DIR, and together they stage all of them once.
#[test]
fn stagein_split_across_mpi_ranks() {
    let has_mpirun = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_mpirun {
        eprintln!("SKIPPED: mpirun not installed (apt install openmpi-bin)");
        return;
    }
    let backend = std::env::temp_dir().join(format!("chfs-tools-mpi-{}", std::process::id()));
    let _ = fs::remove_dir_all(&backend);
    let mut total = 0u64;
    for d in 0..3 {
        fs::create_dir_all(backend.join(format!("in/d{d}"))).unwrap();
        for i in 0..10 {
            let len = 5_000 + d * 1000 + i * 37;
            fs::write(backend.join(format!("in/d{d}/f{i}")), vec![i as u8; len]).unwrap();
            total += len as u64;
        }
    }
    let pool = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec![
            "--backend".into(),
            backend.display().to_string(),
            "--flush-idle-msec".into(),
            "60000".into(),
        ],
        ..Default::default()
    })
    .unwrap();
    let list = backend.join("list");
    fs::write(&list, "/in/d0\n/in/d1\n").unwrap();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args(["-x", "CHFS_SERVER"])
        .arg(env!("CARGO_BIN_EXE_chstagein"))
        .args(["-v", "--from"])
        .arg(&list)
        .arg("/in/d2")
        .env("CHFS_SERVER", pool.server_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Each rank reports its share: 30 files split 10/10/10, all bytes once.
    let mut files = 0;
    let mut bytes = 0;
    for r in 0..3 {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("chstagein[{r}/3]: ")))
            .unwrap_or_else(|| panic!("no report of rank {r}: {err}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        files += words[1].parse::<usize>().unwrap();
        bytes += words[3].parse::<u64>().unwrap();
    }
    assert_eq!((files, bytes), (30, total), "{err}");
    // Everything is cached: with the backend gone, the data still reads.
    fs::remove_dir_all(backend.join("in")).unwrap();
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap();
    for d in 0..3 {
        for i in 0..10usize {
            let p = format!("/in/d{d}/f{i}");
            let len = 5_000 + d * 1000 + i * 37;
            let fd = c.open(&p, libc::O_RDONLY, 0).unwrap();
            let mut buf = vec![0u8; len + 10];
            assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), len, "{p}");
            assert!(buf[..len].iter().all(|&b| b == i as u8), "{p}");
            c.close(fd).unwrap();
        }
    }
    drop(pool);
    let _ = fs::remove_dir_all(&backend);
}
