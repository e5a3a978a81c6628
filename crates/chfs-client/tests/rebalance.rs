//! Growing a pool (`chfsctl -A`): files written before a server joined are
//! found again after a rebalance, with the same bytes, modes and listings.

mod common;

use common::{client, pattern, LocalPool, PoolOptions};
use libc::{O_RDONLY, O_RDWR};

/// Paths and contents of a small tree (empty, small and multi-chunk files).
fn tree() -> Vec<(String, Vec<u8>)> {
    (0..60)
        .map(|i| {
            let len = match i % 4 {
                0 => 0,
                1 => 100,
                2 => 9_000,
                _ => 40_000,
            };
            (format!("/d{}/f{i}", i % 3), pattern(len, i))
        })
        .collect()
}

fn read_all(c: &chfs_client::Client, path: &str) -> chfs_client::Result<Vec<u8>> {
    let fd = c.open(path, O_RDONLY, 0)?;
    let size = c.stat(path)?.size as usize;
    let mut back = vec![0u8; size];
    let n = c.pread(fd, &mut back, 0);
    c.close(fd)?;
    back.truncate(n?);
    Ok(back)
}

/// Grows a 2-server pool holding a tree to 3 servers and rebalances;
/// returns (chunks moved, chunks stored).
fn grows(hashing: &str) -> (u64, u64) {
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--hashing".into(), hashing.into()],
        ..Default::default()
    })
    .unwrap();
    let c = client(&p, |c| c.chunk_size = 4096);
    for d in 0..3 {
        c.mkdir(&format!("/d{d}"), 0o755).unwrap();
    }
    let files = tree();
    for (i, (path, data)) in files.iter().enumerate() {
        let fd = c.create(path, O_RDWR, 0o600 + (i as u32 % 8)).unwrap();
        c.pwrite(fd, data, 0).unwrap();
        c.close(fd).unwrap();
    }
    let stored: u64 = c
        .server_status()
        .into_iter()
        .map(|(_, s)| s.unwrap().entries)
        .sum();
    p.add_server().unwrap();
    // A client of the grown pool asks the new owners: without a rebalance
    // some files are lost to it.
    let c3 = client(&p, |c| c.chunk_size = 4096);
    assert_eq!(c3.servers().len(), 3);
    let lost = files
        .iter()
        .filter(|(path, data)| read_all(&c3, path).ok().as_ref() != Some(data))
        .count();
    assert!(lost > 0, "no file changed owner: the test proves nothing");

    let r = c3.rebalance().unwrap();
    assert!(r.moved > 0 && r.failed == 0, "{r:?}");
    for (i, (path, data)) in files.iter().enumerate() {
        assert_eq!(&read_all(&c3, path).unwrap(), data, "{path}");
        assert_eq!(c3.stat(path).unwrap().mode & 0o7777, 0o600 + (i as u32 % 8));
    }
    for d in 0..3 {
        let mut names: Vec<_> = c3
            .readdir(&format!("/d{d}"))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n != "." && n != "..")
            .collect();
        names.sort();
        let mut want: Vec<_> = files
            .iter()
            .filter_map(|(path, _)| path.strip_prefix(&format!("/d{d}/")))
            .map(str::to_string)
            .collect();
        want.sort();
        assert_eq!(names, want, "/d{d}");
    }
    let used = c3
        .server_status()
        .into_iter()
        .filter(|(_, s)| s.as_ref().unwrap().entries > 0)
        .count();
    assert_eq!(used, 3, "the new server holds its share");
    // Nothing is left to move; a file written after the list grew is not
    // overwritten by an older copy.
    let again = c3.rebalance().unwrap();
    assert_eq!((again.moved, again.failed, again.running), (0, 0, false));
    p.stop();
    (r.moved, stored)
}

#[test]
fn files_written_before_a_server_joined_are_found_after_rebalance() {
    let (moved, stored) = grows("modular");
    assert!(moved <= stored);
}

#[test]
fn rebalance_with_consistent_hashing_moves_only_what_changed_owner() {
    // One server in three is new: about a third of the chunks move.
    let (moved, stored) = grows("consistent");
    assert!(moved * 2 < stored, "{moved} of {stored} chunks moved");
}

#[test]
fn newer_copy_at_the_owner_is_kept() {
    let mut p = LocalPool::start(1).unwrap();
    let c = client(&p, |_| {});
    let names: Vec<String> = (0..40).map(|i| format!("/n{i}")).collect();
    for n in &names {
        let fd = c.create(n, O_RDWR, 0o644).unwrap();
        c.pwrite(fd, b"old", 0).unwrap();
        c.close(fd).unwrap();
    }
    p.add_server().unwrap();
    let c2 = client(&p, |_| {});
    // Files the new server owns are rewritten through the grown pool
    // before the rebalance: the new server now holds the newer copy.
    let mut rewritten = Vec::new();
    for n in &names {
        if c2.stat(n).is_err() {
            let fd = c2.create(n, O_RDWR, 0o644).unwrap();
            c2.pwrite(fd, b"new!", 0).unwrap();
            c2.close(fd).unwrap();
            rewritten.push(n.clone());
        }
    }
    assert!(!rewritten.is_empty());
    let r = c2.rebalance().unwrap();
    assert!(r.kept >= rewritten.len() as u64, "{r:?}");
    for n in &names {
        let want: &[u8] = if rewritten.contains(n) {
            b"new!"
        } else {
            b"old"
        };
        assert_eq!(read_all(&c2, n).unwrap(), want, "{n}");
    }
    p.stop();
}

#[test]
fn chunks_that_cannot_move_stay_where_they_were() {
    let mut p = LocalPool::start(2).unwrap();
    let c = client(&p, |c| c.chunk_size = 4096);
    let files = tree();
    for d in 0..3 {
        c.mkdir(&format!("/d{d}"), 0o755).unwrap();
    }
    for (path, data) in &files {
        let fd = c.create(path, O_RDWR, 0o644).unwrap();
        c.pwrite(fd, data, 0).unwrap();
        c.close(fd).unwrap();
    }
    let entries = |c: &chfs_client::Client| -> u64 {
        c.server_status()
            .into_iter()
            .filter_map(|(_, s)| s.ok())
            .map(|s| s.entries)
            .sum()
    };
    let stored = entries(&c);
    p.add_server().unwrap();
    let c3 = client(&p, |c| c.chunk_size = 4096);
    assert_eq!(c3.servers().len(), 3);
    p.kill(2);
    let e = c3.rebalance().unwrap_err();
    assert_eq!(e.errno(), libc::ECONNREFUSED, "{e}");
    // Every chunk is still on the two old servers.
    assert_eq!(entries(&c3), stored);
    p.stop();
}
