//! Descriptors a program using the client passes on to the programs it
//! execs: none of the transport's, over TCP and over libfabric.

mod common;

use chfs_client::flags::*;
use chfs_localpool::{LocalPool, PoolOptions};
use common::*;

/// A program using the client execs another (std's `Command` keeps every
/// descriptor that is not close-on-exec): the new program gets none of
/// the transport's sockets or epoll sets. libfabric makes them without
/// close-on-exec; inherited, they would keep the client's connections
/// open after it ends, and a program closing or reusing their numbers
/// could not tell them from its own.
#[test]
fn an_exec_gets_none_of_the_transports_descriptors() {
    let mut protocols = vec![None];
    if chfs_fabric::BUILT_WITH_LIBFABRIC {
        protocols.push(Some("ofi+tcp"));
    } else {
        chfs_localpool::skip(
            "fabric",
            "an_exec_gets_none_of_the_transports_descriptors (ofi+tcp)",
            "built without libfabric",
        );
    }
    for protocol in protocols {
        let mut opts = PoolOptions {
            servers: 2,
            ..Default::default()
        }
        .with_new_secret();
        if let Some(p) = protocol {
            opts.args = vec!["-p".into(), p.into()];
        }
        let p = LocalPool::start_with(opts).expect("start pool");
        let c = client(&p, |c| c.secret = p.secret().unwrap().as_bytes().to_vec());
        // Every server reached (a session each), and data moved.
        let data = pattern(1 << 20, 3);
        let fd = c.create("/x", O_RDWR, 0o644).unwrap();
        assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
        c.close(fd).unwrap();
        let out = std::process::Command::new("sh")
            .args(["-c", "for f in /proc/$$/fd/*; do readlink $f; done"])
            .output()
            .unwrap();
        let fds = String::from_utf8_lossy(&out.stdout);
        let inherited: Vec<_> = fds
            .lines()
            .filter(|l| l.starts_with("socket:") || l.starts_with("anon_inode:"))
            .collect();
        assert!(
            inherited.is_empty(),
            "{protocol:?}: the child inherited {inherited:?}"
        );
        c.unlink("/x").unwrap();
    }
}
