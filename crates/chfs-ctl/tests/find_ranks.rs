//! The pieces of chfind under mpirun, in one process: the servers'
//! directories-only listing (paged on both sides) and `find_ranked`, whose
//! ranks must examine every entry exactly once between them, from tree
//! listings (a request per server and page, not per directory) or, from
//! servers that do not serve those, by walking.

mod find_tree;

use std::collections::BTreeSet;
use std::sync::Mutex;

use chfs_ctl::find::{find, find_ranked, Filter, RankSplit};
use chfs_localpool::{LocalPool, PoolOptions};
use find_tree::{build, connect, local_dir};

const DIRS: usize = 10_000;
const FILES: usize = 6_000;

#[test]
fn dirs_only_listing_and_rank_split() {
    let pool = LocalPool::start(2).expect("start chfsd pool");
    let c = connect(&pool);
    c.mkdir("/m", 0o755).unwrap();
    // Names interleave directories and files, and each server holds more
    // than a page (4096) of directories among more than two pages of
    // entries, so both the server's scan and the client's resumption page.
    std::thread::scope(|s| {
        for w in 0..4 {
            let c = c.clone();
            s.spawn(move || {
                for i in (w..DIRS + FILES).step_by(4) {
                    if i % 8 < 5 && i / 8 * 5 + i % 8 < DIRS {
                        c.mkdir(&format!("/m/e{i:05}"), 0o755).unwrap();
                    } else {
                        let fd = c
                            .create(&format!("/m/e{i:05}"), libc::O_WRONLY, 0o644)
                            .unwrap();
                        c.close(fd).unwrap();
                    }
                }
            });
        }
    });
    let all = c.readdir("/m").unwrap();
    assert_eq!(all.len(), DIRS + FILES);
    let want: BTreeSet<String> = all
        .iter()
        .filter(|e| e.stat.is_dir())
        .map(|e| e.name.clone())
        .collect();
    assert!(want.len() > 2 * 4096 && want.len() < DIRS + FILES);
    let mut got = BTreeSet::new();
    for i in 0..c.server_count() {
        let part = c.readdir_dirs_index("/m", i).unwrap();
        let full = c.readdir_index("/m", i).unwrap();
        let full_dirs: Vec<_> = full.iter().filter(|e| e.stat.is_dir()).collect();
        assert!(part.len() > 4096, "server {i}: {} directories", part.len());
        assert_eq!(part.len(), full_dirs.len(), "server {i}");
        for e in part {
            assert!(e.stat.is_dir(), "{} is not a directory", e.name);
            assert!(got.insert(e.name.clone()), "{} listed twice", e.name);
        }
    }
    assert_eq!(got, want);

    // find_ranked: for 1 to 3 ranks (3 > servers: one rank owns none), the
    // ranks' matches are the single find's, each once, and the counts add up.
    let mut f = Filter::default();
    f.set_name("e*1").unwrap();
    let one = Mutex::new(Vec::new());
    let (st1, errs) = find(&c, "/m", &f, 4, &|p| {
        one.lock().unwrap().push(p.to_string())
    });
    assert!(errs.is_empty());
    assert_eq!(st1.seen as usize, DIRS + FILES + 1);
    let mut one = one.into_inner().unwrap();
    one.sort();
    assert!(!one.is_empty());
    for ranks in 1..=3 {
        let (mut seen, mut matched) = (0, 0);
        let mut lines = Vec::new();
        for rank in 0..ranks {
            let mine = Mutex::new(Vec::new());
            let split = RankSplit { rank, ranks };
            let (st, errs) = find_ranked(&c, "/m", &f, 4, split, &|p| {
                mine.lock().unwrap().push(p.to_string())
            });
            assert!(errs.is_empty(), "{errs:?}");
            seen += st.seen;
            matched += st.matched;
            lines.extend(mine.into_inner().unwrap());
        }
        lines.sort();
        assert_eq!(seen, st1.seen, "{ranks} ranks");
        assert_eq!(matched, st1.matched, "{ranks} ranks");
        assert_eq!(lines, one, "{ranks} ranks");
    }
}

/// The ranks' finds over `servers` servers started with `args`, for 1 to
/// `servers + 1` ranks (each with a client of its own): every entry of the
/// tree of `entries` entries examined once, the matches of `-name` (with
/// `-size`/`-newer` when `meta`) those of one find. Returns the most
/// requests a rank made.
fn ranks_add_up(args: &[&str], servers: usize, meta: bool) -> u64 {
    let pool = LocalPool::start_with(PoolOptions {
        servers,
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    })
    .expect("start chfsd pool");
    let c = connect(&pool);
    let tmp = local_dir();
    let entries = 3000;
    assert_eq!(build(&c, tmp.path(), entries), entries);
    let mut f = Filter::default();
    f.set_name("*01*").unwrap();
    if meta {
        f.size = Some(chfs_ctl::find::SizeTest::parse("-1k").unwrap());
        f.newer_than = Some((find_tree::BASE + 300) * 1_000_000_000);
    }
    let one = Mutex::new(Vec::new());
    let (st1, errs) = find(&c, "/t", &f, 4, &|p| {
        one.lock().unwrap().push(p.to_string())
    });
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(st1.seen as usize, entries);
    let mut one = one.into_inner().unwrap();
    one.sort();
    assert!(!one.is_empty() && one.len() < entries / 2, "a weak query");
    let mut most = 0;
    for ranks in 1..=servers + 1 {
        let (mut seen, mut matched) = (0, 0);
        let mut lines = Vec::new();
        for rank in 0..ranks {
            let c = connect(&pool);
            let before = c.stats().rpcs;
            let mine = Mutex::new(Vec::new());
            let split = RankSplit { rank, ranks };
            let (st, errs) = find_ranked(&c, "/t", &f, 4, split, &|p| {
                mine.lock().unwrap().push(p.to_string())
            });
            assert!(errs.is_empty(), "{ranks} ranks, rank {rank}: {errs:?}");
            most = most.max(c.stats().rpcs - before);
            seen += st.seen;
            matched += st.matched;
            lines.extend(mine.into_inner().unwrap());
        }
        lines.sort();
        assert_eq!(seen, st1.seen, "{ranks} ranks");
        assert_eq!(matched, st1.matched, "{ranks} ranks");
        assert_eq!(lines, one, "{ranks} ranks");
    }
    most
}

/// Ranks list trees: servers that refuse every directory listing (as a
/// server that does not know the requests: EPROTO) still serve a ranked
/// find, with a few requests per rank (the root's lookup, a tree listing
/// per server), not one per directory and server (221 directories here).
#[test]
fn ranks_list_trees_not_directories() {
    let args = ["--unknown-op", "READDIR", "--unknown-op", "READDIR_DIRS"];
    for meta in [false, true] {
        let most = ranks_add_up(&args, 3, meta);
        assert!(most <= 3 + 3, "a rank made {most} requests");
    }
}

/// Servers that do not serve tree listings: the ranks walk (and still
/// examine every entry once).
#[test]
fn ranks_walk_servers_without_tree_listings() {
    let most = ranks_add_up(&["--unknown-op", "LIST_TREE"], 3, true);
    assert!(most > 200, "a rank walked with only {most} requests");
}
