//! Relayed lookups (`CHFS_LOOKUP_LOCAL`, `CHFS_LOOKUP_RELAY_GROUP`,
//! `CHFS_LOOKUP_RELAY_GROUP_AUTO`): which *contact* server a lookup of
//! an entry goes to instead of the entry's owner, and the paths this
//! client changed recently, whose lookups go to the owner (so a contact's
//! cached answer never hides this client's own change).
//!
//! Placement of contacts (as CHFS): with relay groups of number `g`,
//! server `i` is in group `i % g` and row `i / g`. A client belongs to
//! the group of its own server (the one on its host; with none, by its
//! seed), and looks up an entry owned by server `o` through the server
//! of its group in `o`'s row (the owner itself when it is of the
//! client's group; in a last, short row that lacks the group, a server of
//! the group chosen by `o`). The client then reaches only the servers of
//! its group for lookups, about `n / g` of them, and the owner of an
//! entry hears from at most one contact per group, plus the clients of
//! its own group. With `CHFS_LOOKUP_LOCAL` every lookup goes to the
//! client's own server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chfs_sys::lock;

use crate::config::Lookup;

/// The smallest `r` with `r * r >= n`.
pub(crate) fn ceil_sqrt(n: usize) -> usize {
    let mut r = (n as f64).sqrt() as usize;
    while r * r < n {
        r += 1;
    }
    while r > 0 && (r - 1) * (r - 1) >= n {
        r -= 1;
    }
    r
}

/// The contact of each owner (by server index) for a client whose own
/// server is `me`, with relay groups of number `g`.
fn group_contacts(n: usize, g: usize, me: usize) -> Vec<usize> {
    let my_g = me % g;
    // Servers of my group: my_g, my_g + g, ...
    let nodes_g = n / g + usize::from(my_g < n % g);
    (0..n)
        .map(|i| {
            let (target_g, target_l) = (i % g, i / g);
            if target_g == my_g {
                i
            } else if target_l < nodes_g {
                my_g + target_l * g
            } else {
                my_g + (i % nodes_g) * g
            }
        })
        .collect()
}

/// The contact of each owner (None: every lookup goes to its owner), for
/// `n` servers of which `local` run on this host, with the client's
/// `seed` choosing among candidates.
pub(crate) fn contacts(n: usize, lookup: Lookup, local: &[usize], seed: u64) -> Option<Vec<usize>> {
    if n < 2 {
        return None;
    }
    let own = |k: usize| (seed % k as u64) as usize;
    let me = if local.is_empty() {
        None
    } else {
        Some(local[own(local.len())])
    };
    match lookup {
        Lookup::Local => me.map(|me| vec![me; n]),
        Lookup::RelayGroup(g) => relay(n, g as usize, me.unwrap_or_else(|| own(n))),
        Lookup::RelayAuto => relay(n, ceil_sqrt(n), me.unwrap_or_else(|| own(n))),
        _ => None,
    }
}

fn relay(n: usize, g: usize, me: usize) -> Option<Vec<usize>> {
    (g >= 2).then(|| group_contacts(n, g.min(n), me))
}

/// The servers of `servers` that run on this host: those whose local
/// socket (`chfsd@ADDR`, abstract) this network namespace has, as listed
/// in /proc/net/unix. Opens no connection.
pub(crate) fn local_servers(servers: &[String]) -> Vec<usize> {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let names: std::collections::HashSet<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@'))
        .collect();
    servers
        .iter()
        .enumerate()
        .filter(|(_, s)| names.contains(chfs_proto::local_socket_name(s).as_str()))
        .map(|(i, _)| i)
        .collect()
}

/// This process's rank among the job's processes on this host, from the
/// variables MPI launchers and Slurm set, else its pid: spreads the
/// clients of a host over their candidate contacts.
pub(crate) fn default_seed() -> u64 {
    for v in [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "MPI_LOCAL_RANK",
        "PMI_LOCAL_RANK",
        "SLURM_LOCALID",
    ] {
        if let Some(r) = std::env::var(v).ok().and_then(|s| s.trim().parse().ok()) {
            return r;
        }
    }
    u64::from(std::process::id())
}

/// Did a request to a contact fail because the contact could not be
/// reached (the lookup then goes to the owner)? A connection refused,
/// reset or lost, or a request that never left; not a timeout (the
/// client waited its time already) nor an errno the contact answered.
pub(crate) fn unreachable(e: &crate::Error) -> bool {
    if e.errno() == libc::ETIMEDOUT {
        return false;
    }
    e.conn_fault() != crate::error::ConnFault::None
        || matches!(
            e.errno(),
            libc::ECONNREFUSED
                | libc::ECONNRESET
                | libc::ECONNABORTED
                | libc::EPIPE
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
        )
}

/// Most paths remembered one by one; beyond, every lookup goes to its
/// owner until the oldest would have expired.
const MAX_PATHS: usize = 65_536;

/// Paths this client changed in the last `ttl` (the oldest answer a
/// contact may give it): their lookups go to the owner.
#[derive(Default)]
pub(crate) struct OwnChanges {
    ttl: Duration,
    on: bool,
    paths: Mutex<HashMap<String, Instant>>,
    /// Everything, until then (a directory renamed or removed: every path
    /// below it changed; or too many paths).
    all_until: Mutex<Option<Instant>>,
}

impl OwnChanges {
    /// Remembers changes for `ttl` when lookups are relayed (`on`).
    pub fn new(on: bool, ttl: Duration) -> Self {
        Self {
            ttl,
            on,
            ..Default::default()
        }
    }

    /// This client is changing `p` (call before sending the change).
    pub fn changed(&self, p: &str) {
        if !self.on || self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut paths = lock(&self.paths);
        if paths.len() >= MAX_PATHS && !paths.contains_key(p) {
            let ttl = self.ttl;
            paths.retain(|_, t| t.elapsed() < ttl);
            if paths.len() >= MAX_PATHS {
                paths.clear();
                drop(paths);
                self.all(now);
                return;
            }
        }
        paths.insert(p.to_string(), now);
    }

    /// This client is changing everything below `dir` (a rename or a
    /// removal of a directory).
    pub fn changed_below(&self, dir: &str) {
        if self.on && !self.ttl.is_zero() {
            self.changed(dir);
            self.all(Instant::now());
        }
    }

    fn all(&self, now: Instant) {
        *lock(&self.all_until) = Some(now + self.ttl);
    }

    /// Must a lookup of `p` go to its owner?
    pub fn bypass(&self, p: &str) -> bool {
        if self.ttl.is_zero() {
            return false;
        }
        if lock(&self.all_until).is_some_and(|t| Instant::now() < t) {
            return true;
        }
        lock(&self.paths)
            .get(p)
            .is_some_and(|t| t.elapsed() < self.ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn square_roots() {
        for (n, r) in [
            (1, 1),
            (2, 2),
            (4, 2),
            (5, 3),
            (8, 3),
            (9, 3),
            (10, 4),
            (10000, 100),
        ] {
            assert_eq!(ceil_sqrt(n), r, "{n}");
        }
    }

    /// Every contact is of the client's group, and the owner of an entry
    /// hears from at most one contact per group.
    #[test]
    fn contacts_are_of_the_clients_group() {
        for n in 2..40 {
            for g in 2..=n {
                for me in 0..n {
                    let c = group_contacts(n, g, me);
                    for (o, &k) in c.iter().enumerate() {
                        assert!(k < n, "n {n} g {g} me {me} owner {o}");
                        assert_eq!(k % g, me % g, "n {n} g {g} me {me} owner {o}");
                        if o % g == me % g {
                            assert_eq!(k, o);
                        }
                    }
                }
                // The contacts (over every group) of one owner: one per group.
                for o in 0..n {
                    let mut by_group = HashMap::new();
                    for me in 0..n {
                        let k = group_contacts(n, g, me)[o];
                        assert_eq!(*by_group.entry(me % g).or_insert(k), k);
                    }
                }
            }
        }
    }

    #[test]
    fn local_and_direct() {
        assert_eq!(contacts(4, Lookup::Direct, &[1], 0), None);
        assert_eq!(contacts(4, Lookup::Local, &[], 0), None);
        assert_eq!(contacts(4, Lookup::Local, &[1, 3], 3), Some(vec![3; 4]));
        assert_eq!(contacts(4, Lookup::RelayGroup(1), &[], 0), None);
        assert_eq!(contacts(1, Lookup::RelayAuto, &[0], 0), None);
        // 9 servers, 3 groups, client of server 4 (group 1).
        assert_eq!(
            contacts(9, Lookup::RelayAuto, &[4], 0),
            Some(vec![1, 1, 1, 4, 4, 4, 7, 7, 7])
        );
    }

    #[test]
    fn own_changes_bypass_the_contact_for_a_while() {
        let c = OwnChanges::new(true, Duration::from_millis(50));
        assert!(!c.bypass("/a/b"));
        c.changed("/a");
        assert!(c.bypass("/a"));
        assert!(!c.bypass("/a/b"));
        assert!(!c.bypass("/b"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!c.bypass("/a"));
        c.changed_below("/d");
        assert!(c.bypass("/x"));
        let off = OwnChanges::new(false, Duration::from_secs(1));
        off.changed("/a");
        assert!(!off.bypass("/a"));
    }
}
