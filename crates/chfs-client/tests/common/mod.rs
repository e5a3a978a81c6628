//! Helpers shared by the integration tests: a real pool of chfsd processes.

#![allow(dead_code)]

use chfs_client::{Client, ClientConfig};
#[allow(unused_imports)]
pub use chfs_localpool::{LocalPool, PoolOptions};

/// Starts `n` servers and a client connected to the first one only (the
/// rest of the list is fetched from it).
pub fn pool(n: usize) -> (LocalPool, Client) {
    let p = LocalPool::start(n).expect("start chfsd pool");
    let c = client(&p, |_| {});
    (p, c)
}

/// A client of `p` with a modified configuration.
pub fn client(p: &LocalPool, f: impl FnOnce(&mut ClientConfig)) -> Client {
    let mut cfg = ClientConfig {
        servers: vec![p.addrs()[0].clone()],
        ..Default::default()
    };
    cfg.rpc_timeout = std::time::Duration::from_secs(10);
    f(&mut cfg);
    Client::connect(cfg).expect("connect client")
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A pool of `n` servers over `ofi+tcp` with a secret, or None (the test
/// skipped, or failed where the suite requires `fabric`) where this build
/// has no libfabric.
pub fn fabric_pool(n: usize, test: &str) -> Option<LocalPool> {
    fabric_pool_with(n, test, &[])
}

/// [`fabric_pool`] whose servers get `extra` arguments too (e.g.
/// `--unknown-op OP`: servers older than a request).
pub fn fabric_pool_with(n: usize, test: &str, extra: &[&str]) -> Option<LocalPool> {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric");
        return None;
    }
    let mut args = vec!["-p".to_string(), "ofi+tcp".to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    let p = LocalPool::start_with(
        PoolOptions {
            servers: n,
            args,
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd pool over ofi+tcp");
    Some(p)
}
