//! Joining a pool while some of its members hang.

mod common;

use std::time::{Duration, Instant};

use chfs_proto::{Request, Response};
use common::*;

fn servers_of(addr: &str) -> Vec<String> {
    let (mut s, _, _) = hello(addr, b"");
    match call(&mut s, 1, &Request::GetServers) {
        Ok(Response::Servers(l)) => l.servers,
        other => panic!("{other:?}"),
    }
}

/// The leader pushes a new member's list to every other member at once and
/// answers the joining server within half the RPC timeout, however many
/// members hang; the hung ones get the list when they wake up. (Pushed one
/// after another, two hung members took two timeouts, and the joining
/// server, which waits one, failed to start.)
#[test]
fn a_server_joins_while_members_hang() {
    let timeout = Duration::from_millis(2000);
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 4,
        args: vec!["--rpc-timeout-msec".into(), timeout.as_millis().to_string()],
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap();
    for i in [1, 2] {
        p.signal(i, libc::SIGSTOP).unwrap();
    }
    let t = Instant::now();
    let added = p.add_server();
    let took = t.elapsed();
    for i in [1, 2] {
        p.signal(i, libc::SIGCONT).unwrap();
    }
    let added = added.expect("a server joins while two members hang");
    assert!(took < timeout, "joining took {took:?}");
    let all = p.addrs().to_vec();
    assert!(servers_of(&all[0]).contains(&added));
    assert!(servers_of(&all[3]).contains(&added));
    assert_eq!(servers_of(&added), all);
    // The members that hung took the list once they woke up.
    let deadline = Instant::now() + Duration::from_secs(10);
    for a in &all[1..3] {
        while !servers_of(a).contains(&added) {
            assert!(Instant::now() < deadline, "{a} never got the new list");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
