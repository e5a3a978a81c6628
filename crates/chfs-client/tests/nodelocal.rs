//! The node-local area (`CHFS_NODE_LOCAL_PREFIX`, default `/.nodelocal`):
//! entries kept by the server on the creating node, seen there only,
//! never moved to another server, discarded when the servers stop.

mod common;

use chfs_client::flags::*;
use chfs_client::Client;
use common::*;

const AREA: &str = chfs_proto::path::NODE_LOCAL_PREFIX;

/// `entries` and `node_local_entries` of every server (placement order).
fn counts(c: &Client) -> Vec<(u64, u64)> {
    c.server_status()
        .into_iter()
        .map(|(_, s)| s.map(|s| (s.entries, s.node_local_entries)).unwrap())
        .collect()
}

#[test]
fn node_local_entries_stay_on_the_local_server() {
    let p = LocalPool::start(4).expect("pool");
    let c = client(&p, |cfg| cfg.chunk_size = 4096);
    // Every server is on this host: the first keeps the area.
    let (local, _) = c.entry_servers(&format!("{AREA}/x")).unwrap();
    assert_eq!(local, 0);
    let before = counts(&c);
    c.mkdir(&format!("{AREA}/d"), 0o755).unwrap();
    let data = pattern(10 * 4096 + 7, 3);
    for i in 0..20 {
        let f = format!("{AREA}/d/f{i}");
        let fd = c.create(&f, O_RDWR, 0o644).unwrap();
        assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
        c.close(fd).unwrap();
    }
    let after = counts(&c);
    // 1 directory + 20 files x 11 chunks, all on the local server; the
    // other servers hold not one more entry.
    assert_eq!(after[local].0 - before[local].0, 1 + 20 * 11, "{after:?}");
    assert_eq!(after[local].1, 21, "{after:?}");
    for i in (0..4).filter(|&i| i != local) {
        assert_eq!(after[i], before[i], "server {i}: {after:?}");
    }
    // Read back, listed, stat'ed, renamed within the area.
    let f0 = format!("{AREA}/d/f0");
    let fd = c.open(&f0, O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len() + 10];
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    assert_eq!(&back[..data.len()], &data[..]);
    c.close(fd).unwrap();
    assert_eq!(c.readdir(&format!("{AREA}/d")).unwrap().len(), 20);
    assert_eq!(c.stat(&f0).unwrap().size, data.len() as u64);
    let moved = format!("{AREA}/d/moved");
    c.rename(&f0, &moved).unwrap();
    assert_eq!(c.stat(&moved).unwrap().size, data.len() as u64);
    assert_eq!(
        counts(&c)[local].0,
        after[local].0,
        "a rename moves nothing away"
    );
    // A parallel find (chfind: each server's part of a directory) sees
    // this node's area on its server only.
    for i in (0..4).filter(|&i| i != local) {
        assert!(c.readdir_index(AREA, i).unwrap().is_empty(), "server {i}");
    }
    assert_eq!(c.readdir_index(AREA, local).unwrap().len(), 1);
    assert_eq!(c.readdir_dirs_index(AREA, local).unwrap().len(), 1);
    // Between the area and the shared namespace: EXDEV, both ways.
    assert_eq!(c.rename(&moved, "/out").unwrap_err().errno(), libc::EXDEV);
    let fd = c.create("/shared", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    assert_eq!(
        c.rename("/shared", &format!("{AREA}/in"))
            .unwrap_err()
            .errno(),
        libc::EXDEV
    );
    // The area itself stays.
    assert_eq!(c.rmdir(AREA).unwrap_err().errno(), libc::ENOTEMPTY);
    // Unlinked: every chunk gone from the local server.
    for i in 1..20 {
        c.unlink(&format!("{AREA}/d/f{i}")).unwrap();
    }
    c.unlink(&moved).unwrap();
    c.rmdir(&format!("{AREA}/d")).unwrap();
    assert_eq!(c.rmdir(AREA).unwrap_err().errno(), libc::EBUSY);
    let end = counts(&c);
    let total = |v: &[(u64, u64)]| v.iter().map(|x| x.0).sum::<u64>();
    assert_eq!(total(&end), total(&before) + 1, "only /shared: {end:?}");
    assert_eq!(end[local].1, 0);
}

/// Stopping the servers (as `chfsctl stop` does) discards the area; the
/// shared namespace of a persistent store survives a restart.
#[test]
fn stopping_the_servers_discards_the_node_local_area() {
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 2,
        store: Some("pmem".into()),
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |_| {});
    for f in ["/keep", &format!("{AREA}/scratch")] {
        let fd = c.create(f, O_WRONLY, 0o644).unwrap();
        c.pwrite(fd, b"data", 0).unwrap();
        c.close(fd).unwrap();
    }
    c.shutdown_servers().unwrap();
    drop(c);
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.restart_all().expect("restart");
    let c = client(&p, |_| {});
    assert_eq!(c.stat("/keep").unwrap().size, 4);
    assert_eq!(
        c.stat(&format!("{AREA}/scratch")).unwrap_err().errno(),
        libc::ENOENT
    );
    assert!(c.stat(AREA).unwrap().is_dir());
}

/// A server killed (or crashed) with a persistent store leaves its area
/// in the store: its next start discards it (the area is temporary); the
/// shared namespace survives.
#[test]
fn a_killed_servers_node_local_area_is_discarded_at_its_next_start() {
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 2,
        store: Some("pmem".into()),
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |_| {});
    c.mkdir(&format!("{AREA}/d"), 0o755).unwrap();
    for f in ["/keep", &format!("{AREA}/d/scratch")] {
        let fd = c.create(f, O_WRONLY, 0o644).unwrap();
        c.pwrite(fd, &pattern(100_000, 1), 0).unwrap();
        c.close(fd).unwrap();
    }
    assert_eq!(counts(&c)[0].1, 2);
    drop(c);
    // SIGKILL: nothing is discarded on the way down.
    p.restart_all().expect("restart");
    let c = client(&p, |_| {});
    assert_eq!(c.stat("/keep").unwrap().size, 100_000);
    for f in [format!("{AREA}/d/scratch"), format!("{AREA}/d")] {
        assert_eq!(c.stat(&f).unwrap_err().errno(), libc::ENOENT, "{f}");
    }
    assert!(c.stat(AREA).unwrap().is_dir());
    assert_eq!(counts(&c)[0].1, 0, "no entry (nor chunk) of the area left");
}

/// Client and servers must name the same area: the server on the
/// client's host refuses (EINVAL, naming both) the client's first use of
/// its area, or of the default one when the area is on at one side only;
/// the shared namespace still works for that client.
#[test]
fn client_and_server_must_agree_on_the_area() {
    let p = LocalPool::start(2).expect("pool");
    let other = client(&p, |cfg| cfg.node_local = Some("/scratch".into()));
    let e = other.create("/scratch/x", O_WRONLY, 0o644).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(
        e.message().contains("/scratch") && e.message().contains(AREA),
        "{e}"
    );
    // (and again, from what the client remembers)
    assert_eq!(other.stat("/scratch").unwrap_err().errno(), libc::EINVAL);
    let fd = other.create("/shared", O_WRONLY, 0o644).unwrap();
    other.close(fd).unwrap();
    let off = client(&p, |cfg| cfg.node_local = None);
    let e = off
        .create(&format!("{AREA}/x"), O_WRONLY, 0o644)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.message().contains("none"), "{e}");
    assert!(off.stat("/shared").is_ok());
    drop(p);

    // Servers with another area: a client naming it uses it, a client
    // with the default is refused.
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--node-local-prefix".into(), "/scratch".into()],
        ..Default::default()
    })
    .expect("pool");
    let same = client(&p, |cfg| cfg.node_local = Some("/scratch".into()));
    let fd = same.create("/scratch/x", O_WRONLY, 0o644).unwrap();
    same.close(fd).unwrap();
    assert_eq!(counts(&same)[0].1, 1);
    let default = client(&p, |_| {});
    let e = default.stat(&format!("{AREA}/x")).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
}
