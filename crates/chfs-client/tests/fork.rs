//! A forked child using its parent's `Client` (its open files, its links
//! to the servers), over TCP and over libfabric (`ofi+tcp`): the child
//! opens its own connections or endpoint and leaves the parent's alone,
//! so both go on working (doc/fabric.md, "As built").

mod common;

use chfs_client::flags::*;
use chfs_client::Client;
use chfs_localpool::{LocalPool, PoolOptions};
use common::*;

/// One test for both transports: forking while other test threads of
/// this binary ran the client could copy a lock held in the middle of a
/// call into the child.
#[test]
fn a_forked_child_uses_the_parents_client_and_files() {
    let mut protocols = vec![None];
    if chfs_fabric::BUILT_WITH_LIBFABRIC {
        protocols.push(Some("ofi+tcp"));
    } else {
        chfs_localpool::skip(
            "fabric",
            "a_forked_child_uses_the_parents_client_and_files (ofi+tcp)",
            "built without libfabric",
        );
    }
    for protocol in protocols {
        forked_child_over(protocol);
    }
}

fn forked_child_over(protocol: Option<&str>) {
    let mut opts = PoolOptions {
        servers: 2,
        ..Default::default()
    }
    .with_new_secret();
    if let Some(p) = protocol {
        opts.args = vec!["-p".into(), p.into()];
    }
    let p = LocalPool::start_with(opts).expect("start pool");
    if let Some(proto) = protocol {
        assert!(p.server_string().starts_with(&format!("{proto}://")));
    }
    let c = client(&p, |c| c.secret = p.secret().unwrap().as_bytes().to_vec());
    // 1 MiB of 64 KiB chunks on both servers: over the fabric each chunk
    // moves by RMA (above CHFS_RDMA_THRESH).
    let data = pattern(1 << 20, 7);
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    let fd = c.open("/f", O_RDONLY, 0).unwrap();
    let mut head = vec![0u8; 100_000];
    assert_eq!(c.read(fd, &mut head).unwrap(), head.len());
    assert!(head == data[..100_000]);

    // SAFETY: fork(2); the child runs the closure below (the client's
    // own calls) and leaves with _exit, never returning into the test
    // harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            child(&c, fd, &data);
        }))
        .is_ok();
        // The child's copy of the client goes away: it must not end the
        // parent's sessions.
        drop(c);
        // SAFETY: ends the forked child without running the parent's
        // exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{protocol:?}: the child failed (status {status:#x}; its panic is above)"
    );

    // The parent's file reads on from where the parent was (the child's
    // reads moved its own copy), through the parent's links.
    let mut rest = vec![0u8; data.len()];
    assert_eq!(c.read(fd, &mut rest).unwrap(), data.len() - 100_000);
    assert!(
        rest[..data.len() - 100_000] == data[100_000..],
        "{protocol:?}"
    );
    c.close(fd).unwrap();
    assert_eq!(read_all(&c, "/child"), pattern(300_001, 9), "{protocol:?}");
    // New requests to every server still work.
    for (addr, st) in c.server_status() {
        assert!(st.is_ok(), "{protocol:?} {addr}: {st:?}");
    }
    // And a second child after the first.
    // SAFETY: as above.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let ok = c.stat("/child").is_ok_and(|st| st.size == 300_001);
        // SAFETY: as above.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    c.unlink("/f").unwrap();
    c.unlink("/child").unwrap();
}

/// What the child does with the parent's client: reads on from the
/// parent's open file, writes and lists.
fn child(c: &Client, fd: i32, data: &[u8]) {
    let mut rest = vec![0u8; data.len()];
    assert_eq!(c.read(fd, &mut rest).unwrap(), data.len() - 100_000);
    assert!(rest[..data.len() - 100_000] == data[100_000..]);
    let w = c.create("/child", O_WRONLY, 0o644).unwrap();
    let mine = pattern(300_001, 9);
    assert_eq!(c.pwrite(w, &mine, 0).unwrap(), mine.len());
    c.close(w).unwrap();
    assert_eq!(read_all(c, "/child"), mine);
    let names: Vec<_> = c
        .readdir("/")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.iter().any(|n| n == "child"), "{names:?}");
}

fn read_all(c: &Client, p: &str) -> Vec<u8> {
    let size = c.stat(p).unwrap().size as usize;
    let fd = c.open(p, O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; size + 1];
    let n = c.pread(fd, &mut b, 0).unwrap();
    c.close(fd).unwrap();
    b.truncate(n);
    b
}
