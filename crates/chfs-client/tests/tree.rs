//! Tree listings (`Client::list_tree`, one `ListTree` request per server
//! and page): the same entries as the per-directory walk, the node-local
//! area as the walk sees it, and the fallback when a server does not
//! serve them (an older server: EPROTO; cache mode: EOPNOTSUPP).

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use chfs_client::flags::*;
use chfs_client::Client;
use common::*;

/// What the per-directory walk visits below `root`: path -> (is a
/// directory, size, mode).
fn walked(c: &Client, root: &str) -> BTreeMap<String, (bool, u64, u32)> {
    let found = Mutex::new(BTreeMap::new());
    let errors = c.walk_parallel(root, 4, &|_| true, &|p, e| {
        let s = &e.stat;
        let old = found
            .lock()
            .unwrap()
            .insert(p.to_string(), (s.is_dir(), s.size, s.mode));
        assert!(old.is_none(), "{p} twice");
        true
    });
    assert!(errors.is_empty(), "{errors:?}");
    found.into_inner().unwrap()
}

/// The tree listing of `root` in the same form, checking its order.
fn listed(c: &Client, root: &str) -> BTreeMap<String, (bool, u64, u32)> {
    let t = c.list_tree(root, true).unwrap().expect("served");
    let names = c.list_tree(root, false).unwrap().expect("served");
    assert_eq!(names.len(), t.len());
    // In pages of a few entries: the same.
    for page in [1, 7, 100] {
        let p = c.list_tree_paged(root, true, page).unwrap().unwrap();
        assert_eq!(p, t, "pages of {page}");
    }
    let mut out = BTreeMap::new();
    for i in 0..t.len() {
        assert_eq!(names.path(i), t.path(i));
        assert_eq!(names.is_dir(i), t.is_dir(i));
        if i > 0 {
            assert!(
                t.path(i - 1) < t.path(i),
                "{} then {}",
                t.path(i - 1),
                t.path(i)
            );
        }
        let m = t.meta(i).unwrap();
        out.insert(t.path(i).to_string(), (t.is_dir(i), m.size, m.mode));
    }
    assert!(names.meta(0).is_none());
    out
}

fn file(c: &Client, p: &str, len: usize) {
    let fd = c.create(p, O_WRONLY, 0o644).unwrap();
    if len > 0 {
        assert_eq!(c.pwrite(fd, &pattern(len, 1), 0).unwrap(), len);
    }
    c.close(fd).unwrap();
}

/// Many directories, a chain 40 deep, names that sort between a directory
/// and its entries (`a.txt`, `a-b` between `a` and `a/…`), non-ASCII and
/// long names, symbolic links, a large directory.
fn build(c: &Client, root: &str) {
    c.mkdir_all(root, 0o755).unwrap();
    for d in ["a", "a-b", "a.d", "é", "日本語", "Z"] {
        c.mkdir(&format!("{root}/{d}"), 0o755).unwrap();
        for f in ["x", "x.txt", "x-y", "ü", &"n".repeat(255)] {
            file(c, &format!("{root}/{d}/{f}"), 3);
        }
    }
    file(c, &format!("{root}/a.txt"), 10);
    c.symlink("a", &format!("{root}/link")).unwrap();
    let mut p = format!("{root}/deep");
    for i in 0..40 {
        c.mkdir(&p, 0o700).unwrap();
        file(c, &format!("{p}/f{i}"), i);
        p = format!("{p}/d{i:02}");
    }
    for i in 0..30 {
        c.mkdir(&format!("{root}/m/{i}"), 0o755)
            .or_else(|_| c.mkdir_all(&format!("{root}/m/{i}"), 0o755))
            .unwrap();
        file(c, &format!("{root}/m/{i}/f"), 1);
    }
    c.mkdir(&format!("{root}/big"), 0o755).unwrap();
    for i in 0..3000 {
        file(c, &format!("{root}/big/{i:05}"), 0);
    }
}

#[test]
fn tree_listing_is_what_the_walk_visits() {
    let p = LocalPool::start(3).expect("pool");
    let c = client(&p, |_| {});
    build(&c, "/t");
    // Neighbours that must not be listed, and node-local entries.
    file(&c, "/t2", 1);
    c.mkdir("/t-x", 0o755).unwrap();
    file(&c, "/t-x/in", 1);
    let area = chfs_proto::path::NODE_LOCAL_PREFIX;
    c.mkdir(&format!("{area}/nl"), 0o755).unwrap();
    file(&c, &format!("{area}/nl/f"), 1);
    for root in ["/t", "/", "/t/deep/d00", "/t/big", "/t/a", area] {
        let w = walked(&c, root);
        let t = listed(&c, root);
        assert_eq!(t, w, "{root}");
        assert!(!w.is_empty(), "{root}");
    }
    assert!(!listed(&c, "/").keys().any(|k| k.starts_with(area)));
    assert_eq!(listed(&c, area).len(), 2);
    assert_eq!(listed(&c, "/t").len(), walked(&c, "/t").len());
    assert!(listed(&c, "/none").is_empty());
    // Removed and renamed since: the listing follows.
    c.unlink("/t/a/x").unwrap();
    c.rename("/t/m", "/t/mm").unwrap();
    assert_eq!(listed(&c, "/t"), walked(&c, "/t"));
    assert!(listed(&c, "/t").keys().any(|k| k.starts_with("/t/mm/")));
}

/// Tree listings shared by processes (`Client::list_tree_of`, the ranks
/// of a parallel find): each lists the entries of the servers it picks,
/// of them only those the walk reaches, so processes picking disjoint
/// servers list every entry of `list_tree` once between them. The other
/// servers send their directories only: pages of 16 directories, not of
/// 16 entries of every kind.
#[test]
fn tree_listing_shared_by_processes() {
    let p = LocalPool::start(3).expect("pool");
    let c = client(&p, |_| {});
    build(&c, "/t");
    let all = c.list_tree("/t", true).unwrap().unwrap();
    let want: Vec<&str> = (0..all.len()).map(|i| all.path(i)).collect();
    for n in 1..=4 {
        let mut got = Vec::new();
        for me in 0..n {
            for with_meta in [true, false] {
                let l = c
                    .list_tree_of("/t", with_meta, &|i| i % n == me)
                    .unwrap()
                    .unwrap();
                let paged = c
                    .list_tree_of_paged("/t", with_meta, &|i| i % n == me, 5)
                    .unwrap()
                    .unwrap();
                assert_eq!(paged, l, "{n} processes, {me}: pages of 5");
                if with_meta {
                    for i in 0..l.len() {
                        let j = want.binary_search(&l.path(i)).unwrap();
                        assert_eq!(l.meta(i), all.meta(j), "{}", l.path(i));
                    }
                    got.extend((0..l.len()).map(|i| l.path(i).to_string()));
                } else {
                    assert!(l.meta(0).is_none() || l.is_empty());
                }
            }
        }
        got.sort();
        assert_eq!(got, want, "{n} processes");
    }
    // Only server 0's entries: the others' directories in pages of 16.
    let dirs = (0..all.len()).filter(|&i| all.is_dir(i)).count();
    let of0 = c.list_tree_of("/t", false, &|i| i == 0).unwrap().unwrap();
    let before = c.stats().rpcs;
    let l = c
        .list_tree_of_paged("/t", false, &|i| i == 0, 16)
        .unwrap()
        .unwrap();
    let asked = c.stats().rpcs - before;
    assert_eq!(l, of0);
    // Server 0's pages, a page per 16 of the others' directories, and a
    // last page each.
    let most = (of0.len() / 16 + 1) as u64 + (dirs / 16 + 2) as u64;
    assert!(
        asked <= most,
        "{asked} requests for {} entries of server 0 and {dirs} directories (at most {most})",
        of0.len()
    );
    // No server picked: nothing asked.
    let before = c.stats().rpcs;
    assert!(c
        .list_tree_of("/t", true, &|_| false)
        .unwrap()
        .unwrap()
        .is_empty());
    assert_eq!(c.stats().rpcs, before);
}

#[test]
fn tree_listing_with_entries_created_and_removed_meanwhile() {
    let p = LocalPool::start(2).expect("pool");
    let c = client(&p, |_| {});
    c.mkdir("/r", 0o755).unwrap();
    for d in 0..4 {
        c.mkdir(&format!("/r/{d}"), 0o755).unwrap();
        for f in 0..10_000 {
            file(&c, &format!("/r/{d}/k{f:05}"), 0);
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file(&c, &format!("/r/{}/new{i:06}", i % 4), 0);
                c.unlink(&format!("/r/{}/new{i:06}", i % 4)).unwrap();
                i += 1;
            }
        });
        for page in [50, 999, 4096, 65536, 100_000] {
            let t = c.list_tree_paged("/r", false, page).unwrap().unwrap();
            let kept = (0..t.len()).filter(|&i| t.path(i).contains("/k")).count();
            assert_eq!(kept, 40_000);
            for i in 1..t.len() {
                assert!(t.path(i - 1) < t.path(i));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
}

#[test]
fn servers_without_tree_listings_make_the_caller_walk() {
    // One of the servers answers LIST_TREE as a server older than it
    // does (EPROTO, the connection closed).
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--unknown-op".into(), "LIST_TREE".into()],
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |_| {});
    build(&c, "/o");
    assert!(c.list_tree("/o", false).unwrap().is_none());
    // Not asked again (each ask closes a connection of the older server).
    let rpcs = c.stats().rpcs;
    assert!(c.list_tree("/o", true).unwrap().is_none());
    assert_eq!(c.stats().rpcs, rpcs);
    // The client goes on over new connections.
    assert!(!walked(&c, "/o").is_empty());
    assert_eq!(c.readdir("/o/a").unwrap().len(), 5);
}

#[test]
fn cache_mode_servers_make_the_caller_walk() {
    let backend = std::env::temp_dir().join(format!("chfs-tree-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&backend);
    std::fs::create_dir_all(backend.join("b/c")).unwrap();
    std::fs::write(backend.join("b/c/f"), b"x").unwrap();
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--backend".into(), backend.display().to_string()],
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |_| {});
    file(&c, "/b/g", 1);
    assert!(c.list_tree("/", false).unwrap().is_none());
    // (the walk lists the backend's entries too)
    let w = walked(&c, "/");
    assert!(w.contains_key("/b/c/f"), "{w:?}");
    drop(c);
    drop(p);
    let _ = std::fs::remove_dir_all(&backend);
}

/// A tree whose paths add up to more than a listing's 32-bit offsets hold
/// (4 GiB) is not listed (`None`: the caller walks), never with wrong
/// paths; shown with a small limit, below and above the tree's size.
#[test]
fn a_tree_too_large_for_one_listing_makes_the_caller_walk() {
    let p = LocalPool::start(2).expect("pool");
    let c = client(&p, |_| {});
    build(&c, "/big");
    let t = c.list_tree("/big", false).unwrap().unwrap();
    let size = t.page.paths.len();
    assert!(size > 100, "{size}");
    let same = c
        .list_tree_limited("/big", false, 7, size)
        .unwrap()
        .expect("within the limit");
    assert_eq!(same, t);
    for with_meta in [false, true] {
        for page in [7, 65536] {
            assert!(c
                .list_tree_limited("/big", with_meta, page, size - 1)
                .unwrap()
                .is_none());
        }
    }
    // Not a refusal of the servers: the next listing is asked for again.
    assert_eq!(c.list_tree("/big", false).unwrap().unwrap(), t);
}
