//! Placement: which server owns chunk `idx` of `path`.
//!
//! * Modular hashing (default, as in CHFS): order the servers, owner =
//!   `(hash(path) + idx) mod N`. The chunks of a file are striped round-robin
//!   over all servers starting at a position given by the path.
//! * Consistent hashing (option): a ring of virtual nodes per server; the key
//!   `(path, idx)` goes to the first virtual node at or after its hash.
//!
//! Every server and client computes placement from the same ordered
//! [`ServerList`], so no lookup is ever needed.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// How keys are placed on servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hashing {
    /// `(hash(path) + idx) mod N`.
    #[default]
    Modular,
    /// Consistent hashing with virtual nodes.
    Consistent,
}

impl Hashing {
    /// Wire code.
    pub fn code(self) -> u8 {
        match self {
            Hashing::Modular => 0,
            Hashing::Consistent => 1,
        }
    }
    /// From the wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Hashing::Modular),
            1 => Some(Hashing::Consistent),
            _ => None,
        }
    }
}

impl std::str::FromStr for Hashing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "modular" => Ok(Hashing::Modular),
            "consistent" => Ok(Hashing::Consistent),
            _ => Err(format!("unknown hashing {s:?} (modular or consistent)")),
        }
    }
}

/// The ordered pool membership, versioned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerList {
    /// Incremented on every membership change.
    pub version: u64,
    /// Placement function.
    pub hashing: Hashing,
    /// Server addresses (`host:port`), in placement order.
    pub servers: Vec<String>,
    /// Per server (same order; missing entries are 0): the list version at
    /// which its current store replaced an earlier incarnation's, which
    /// lost what was written to it (a DRAM server restarted, a store
    /// recreated). 0: the server holds everything ever written to it.
    pub since: Vec<u64>,
}

impl ServerList {
    /// [`ServerList::since`] of server `i`.
    pub fn since(&self, i: usize) -> u64 {
        self.since.get(i).copied().unwrap_or(0)
    }

    /// Records that server `i` replaced an earlier incarnation at
    /// `version`.
    pub fn set_since(&mut self, i: usize, version: u64) {
        if self.since.len() < self.servers.len() {
            self.since.resize(self.servers.len(), 0);
        }
        self.since[i] = version;
    }
}

/// Virtual nodes per server for consistent hashing.
const VNODES: u64 = 64;

/// Most servers a list may have (a list received with more is malformed):
/// well above the largest jobs (10,000 nodes), and it bounds what a
/// consistent-hash ring built from a received list takes (64 points of 16
/// bytes per server: 64 MiB at this limit, 1 GiB at the 2^20 it was).
pub const MAX_SERVERS: usize = 1 << 16;

/// Hash of a path (shared by placement and inode numbers).
pub fn path_hash(path: &str) -> u64 {
    xxh3_64(path.as_bytes())
}

/// Placement computed from a [`ServerList`].
#[derive(Debug, Clone)]
pub struct Ring {
    list: ServerList,
    vnodes: Vec<(u64, usize)>,
}

impl Ring {
    /// Builds the placement for a list.
    pub fn new(list: ServerList) -> Self {
        let mut vnodes = Vec::new();
        if list.hashing == Hashing::Consistent {
            for (i, s) in list.servers.iter().enumerate() {
                for v in 0..VNODES {
                    vnodes.push((xxh3_64_with_seed(s.as_bytes(), v), i));
                }
            }
            vnodes.sort_unstable();
        }
        Self { list, vnodes }
    }

    /// The list this ring was built from.
    pub fn list(&self) -> &ServerList {
        &self.list
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.list.servers.len()
    }

    /// True when there is no server.
    pub fn is_empty(&self) -> bool {
        self.list.servers.is_empty()
    }

    /// Index of the server owning chunk `idx` of `path`, given the path hash.
    pub fn owner_of_hash(&self, hash: u64, idx: u64) -> usize {
        let n = self.list.servers.len();
        if n == 0 {
            return 0;
        }
        match self.list.hashing {
            // (hash + idx) mod n, without the sum wrapping at 2^64 (which
            // broke the round robin for hashes near 2^64).
            Hashing::Modular => {
                let n = n as u64;
                let s = hash % n + idx % n;
                (if s >= n { s - n } else { s }) as usize
            }
            Hashing::Consistent => {
                let k = xxh3_64_with_seed(&idx.to_le_bytes(), hash);
                let pos = self.vnodes.partition_point(|&(h, _)| h < k);
                self.vnodes[pos % self.vnodes.len()].1
            }
        }
    }

    /// Index of the server owning chunk `idx` of `path`.
    pub fn owner(&self, path: &str, idx: u64) -> usize {
        self.owner_of_hash(path_hash(path), idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(n: usize, hashing: Hashing) -> ServerList {
        ServerList {
            version: 1,
            hashing,
            servers: (0..n).map(|i| format!("127.0.0.1:{}", 50000 + i)).collect(),
            since: Vec::new(),
        }
    }

    #[test]
    fn modular_stripes_round_robin() {
        let r = Ring::new(list(4, Hashing::Modular));
        let o0 = r.owner("/f", 0);
        for i in 0..16 {
            assert_eq!(r.owner("/f", i), (o0 + i as usize) % 4);
        }
    }

    #[test]
    fn consistent_spreads_keys() {
        let r = Ring::new(list(4, Hashing::Consistent));
        let mut count = [0usize; 4];
        for i in 0..4000 {
            count[r.owner(&format!("/f{i}"), 0)] += 1;
        }
        assert!(count.iter().all(|&c| c > 500), "{count:?}");
    }
}
