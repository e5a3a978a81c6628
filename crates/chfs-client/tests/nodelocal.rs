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
