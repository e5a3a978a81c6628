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
