//! Dead, hung and unreachable servers; bad paths; secrets.

mod common;

use std::time::{Duration, Instant};

use chfs_client::flags::*;
use chfs_client::{Client, ClientConfig};
use common::*;

#[test]
fn killed_server_gives_an_error_not_a_hang() {
    let mut p = LocalPool::start(3).unwrap();
    let c = client(&p, |c| c.rpc_timeout = Duration::from_secs(2));
    c.set_chunk_size(1024).unwrap();
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &pattern(10_000, 1), 0).unwrap();
    p.kill(1);
    let start = Instant::now();
    let mut buf = vec![0u8; 10_000];
    let e = c.pread(fd, &mut buf, 0).unwrap_err();
    assert!(
        [
            libc::EIO,
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::ETIMEDOUT
        ]
        .contains(&e.errno()),
        "unexpected errno {e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // Operations that do not touch the dead server still work.
    let e = c.statfs().unwrap_err();
    assert!(
        e.message().contains(&p.addrs()[1]),
        "error names the server: {e}"
    );
}

#[test]
fn hung_server_times_out() {
    let p = LocalPool::start(2).unwrap();
    let c = client(&p, |c| c.rpc_timeout = Duration::from_millis(800));
    c.mkdir("/d", 0o755).unwrap();
    p.signal(0, libc::SIGSTOP).unwrap();
    p.signal(1, libc::SIGSTOP).unwrap();
    // kill(2) returns before the stop takes effect: wait for state T.
    for i in 0..2 {
        let stat = format!("/proc/{}/stat", p.pid(i).unwrap());
        while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let start = Instant::now();
    let e = c.stat("/d").unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT, "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
    p.signal(0, libc::SIGCONT).unwrap();
    p.signal(1, libc::SIGCONT).unwrap();
    assert!(c.stat("/d").unwrap().is_dir());
}

#[test]
fn unreachable_server_fails_fast() {
    // A port nobody listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let cfg = ClientConfig {
        servers: vec![addr],
        rpc_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let e = Client::connect(cfg).err().expect("must fail");
    assert_eq!(e.errno(), libc::ECONNREFUSED, "{e}");
    let e = Client::connect(ClientConfig::default())
        .err()
        .expect("must fail");
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn paths_are_normalised_and_limited() {
    let (_p, c) = pool(2);
    c.mkdir("/d", 0o755).unwrap();
    let fd = c.create("/d/../x", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    assert!(c.stat("/x").is_ok(), "/d/../x is /x");
    assert!(c.stat("/../../x").is_ok(), ".. never climbs above the root");
    let long = format!("/{}", "n".repeat(256));
    assert_eq!(
        c.create(&long, O_WRONLY, 0o644).unwrap_err().errno(),
        libc::ENAMETOOLONG
    );
    let deep = "/abcdefgh".repeat(600);
    assert_eq!(c.stat(&deep).unwrap_err().errno(), libc::ENAMETOOLONG);
    assert_eq!(c.stat("").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(c.rmdir("/").unwrap_err().errno(), libc::EBUSY);
    assert_eq!(c.mkdir("/", 0o755).unwrap_err().errno(), libc::EEXIST);
}

#[test]
fn secret_is_required_when_configured() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        secret: Some("job-42-secret".into()),
        ..Default::default()
    })
    .unwrap();
    let e = Client::connect(ClientConfig {
        servers: vec![p.addrs()[1].clone()],
        ..Default::default()
    })
    .err()
    .expect("refused");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    assert!(e.message().contains("secret"), "{e}");
    let wrong = ClientConfig {
        servers: vec![p.addrs()[0].clone()],
        secret: b"nope".to_vec(),
        ..Default::default()
    };
    assert_eq!(
        Client::connect(wrong).err().expect("refused").errno(),
        libc::EACCES
    );
    let good = ClientConfig {
        servers: vec![p.addrs()[0].clone()],
        secret: b"job-42-secret".to_vec(),
        ..Default::default()
    };
    let c = Client::connect(good).unwrap();
    c.mkdir("/ok", 0o700).unwrap();
    assert!(c.stat("/ok").unwrap().is_dir());
}

#[test]
fn stat_round_trips_stay_flat_as_files_grow() {
    let (_p, c) = pool(4);
    let mut counts = Vec::new();
    for (i, size) in [1u64 << 16, 1 << 26, 4 << 30].into_iter().enumerate() {
        let path = format!("/big{i}");
        let fd = c
            .open_chunk_size(&path, O_CREAT | O_WRONLY, 0o644, 64 << 10)
            .unwrap();
        c.pwrite(fd, b"z", size - 1).unwrap();
        c.close(fd).unwrap();
        let before = c.stats().rpcs;
        assert_eq!(c.stat(&path).unwrap().size, size);
        let fd = c.open(&path, O_RDONLY, 0).unwrap();
        c.close(fd).unwrap();
        counts.push(c.stats().rpcs - before);
    }
    assert_eq!(
        counts,
        [2, 2, 2],
        "stat + open cost one round trip each, whatever the size"
    );
}

#[test]
fn consistent_hashing_pool_works() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 3,
        args: vec!["--hashing".into(), "consistent".into()],
        ..Default::default()
    })
    .unwrap();
    let c = client(&p, |c| c.chunk_size = 4096);
    let data = pattern(50_000, 9);
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    c.close(fd).unwrap();
    let fd = c.open("/f", O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    c.pread(fd, &mut back, 0).unwrap();
    assert_eq!(back, data);
    let used = c
        .server_status()
        .into_iter()
        .filter(|(_, s)| s.as_ref().unwrap().entries > 0)
        .count();
    assert!(used >= 2, "chunks spread over servers");
}
