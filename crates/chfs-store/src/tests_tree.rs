//! [`Store::list_tree`] on every engine: byte order across directories,
//! paging, the skipped area, and entries created and removed between
//! pages.

use std::collections::BTreeSet;

use chfs_proto::path::is_within;
use chfs_proto::Meta;

use crate::tests::engines;
use crate::Store;

fn meta(dir: bool) -> Meta {
    Meta {
        mode: if dir {
            libc::S_IFDIR | 0o755
        } else {
            libc::S_IFREG | 0o644
        },
        chunk_size: 1024,
        fileid: 1,
        ..Default::default()
    }
}

/// A tree whose byte order differs from a depth-first walk's (`a.txt`,
/// `a-b` sort between `a` and `a/…`), with a chain 30 deep, non-ASCII and
/// long names, an entry whose parent has no entry here, and neighbours
/// outside it (`/t2`, `/u`).
fn tree() -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = vec![
        ("/t".into(), true),
        ("/t/a".into(), true),
        ("/t/a.txt".into(), false),
        ("/t/a-b".into(), true),
        ("/t/a-b/x".into(), false),
        ("/t/a/é".into(), false),
        ("/t/a/Z".into(), false),
        ("/t/a/ z".into(), false),
        ("/t/a/日本語".into(), true),
        ("/t/a/日本語/ファイル".into(), false),
        ("/t/ghost/x".into(), false),
        ("/t/skip".into(), true),
        ("/t/skip/in".into(), false),
        ("/t2".into(), true),
        ("/t2/x".into(), false),
        ("/u/x".into(), false),
    ];
    let long = "l".repeat(200);
    v.push((format!("/t/a/{long}"), false));
    v.push((format!("/t/a/{long}é"), false));
    let mut p = "/t/deep".to_string();
    for i in 0..30 {
        v.push((p.clone(), true));
        v.push((format!("{p}/f{i}"), false));
        p = format!("{p}/d{i:02}");
    }
    for i in 0..300 {
        v.push((format!("/t/many/n{i:04}"), false));
    }
    v.push(("/t/many".into(), true));
    v
}

/// A page of the listing, with and without headers (the same paths;
/// the types those of the headers).
fn page(
    s: &dyn Store,
    dir: &str,
    skip: Option<&str>,
    after: &str,
    max: usize,
) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let done = s
        .list_tree(dir, skip, after, max, true, false, &mut |p, kind, m| {
            let m = m.expect("a header");
            assert_eq!(kind as u32, (m.mode >> 12) & 0xf, "{p}");
            assert_eq!(m.is_dir(), kind == 4);
            out.push(p.to_string())
        })
        .unwrap();
    let mut names = Vec::new();
    let done2 = s
        .list_tree(dir, skip, after, max, false, false, &mut |p, kind, m| {
            assert!(m.is_none());
            names.push((p.to_string(), kind));
        })
        .unwrap();
    assert_eq!(done, done2);
    assert_eq!(
        names.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
        out
    );
    (out, done)
}

/// Every directory below `dir` listed with `dirs_only`, `max` a page.
fn all_dirs(s: &dyn Store, dir: &str, skip: Option<&str>, max: usize) -> Vec<String> {
    let mut got = Vec::new();
    let mut after = String::new();
    loop {
        let mut p = Vec::new();
        let done = s
            .list_tree(dir, skip, &after, max, false, true, &mut |p2, kind, _| {
                assert_eq!(kind, 4, "{p2} is not a directory");
                p.push(p2.to_string());
            })
            .unwrap();
        assert!(p.len() <= max);
        if let Some(l) = p.last() {
            after = l.clone();
        }
        got.extend(p);
        if done {
            return got;
        }
        assert!(
            !after.is_empty(),
            "a page with no directory and more to come"
        );
    }
}

fn all(s: &dyn Store, dir: &str, skip: Option<&str>, max: usize) -> Vec<String> {
    let mut got = Vec::new();
    let mut after = String::new();
    loop {
        let (p, done) = page(s, dir, skip, &after, max);
        assert!(p.len() <= max);
        if let Some(l) = p.last() {
            after = l.clone();
        }
        got.extend(p);
        if done {
            return got;
        }
    }
}

#[test]
fn tree_listing_is_every_entry_below_in_byte_order_in_pages() {
    for (s, _dir) in engines() {
        let t = tree();
        for (p, d) in &t {
            s.create(p, meta(*d), b"", true).unwrap();
        }
        // A data chunk is not an entry.
        s.write("/t/a.txt", 3, 0, b"x", &meta(false)).unwrap();
        for (dir, skip) in [
            ("/t", Some("/t/skip")),
            ("/t", None),
            ("/", None),
            ("/t/a", None),
        ] {
            let want: Vec<String> = t
                .iter()
                .map(|(p, _)| p.clone())
                .filter(|p| p != dir && is_within(p, dir))
                .filter(|p| !skip.is_some_and(|s| p != s && is_within(p, s)))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let want_dirs: Vec<String> = want
                .iter()
                .filter(|p| t.iter().any(|(q, d)| *d && q == *p))
                .cloned()
                .collect();
            assert!(!want_dirs.is_empty() && want_dirs.len() < want.len());
            for max in [1, 2, 3, 7, 64, 511, 512, 513, 100_000] {
                assert_eq!(all(&*s, dir, skip, max), want, "{dir} {skip:?} max {max}");
                assert_eq!(
                    all_dirs(&*s, dir, skip, max),
                    want_dirs,
                    "directories only: {dir} {skip:?} max {max}"
                );
            }
        }
        assert_eq!(page(&*s, "/nothing", None, "", 10), (vec![], true));
        // Resuming after a path that is not (or no longer) an entry.
        let (p, _) = page(&*s, "/t", None, "/t/a/b", 3);
        assert_eq!(p[0], "/t/a/l".to_string() + &"l".repeat(199));
    }
}

#[test]
fn tree_listing_with_entries_created_and_removed_between_pages() {
    for (s, _dir) in engines() {
        let mut present = BTreeSet::new();
        for d in 0..20 {
            for f in 0..30 {
                let p = format!("/r/d{d:02}/f{f:02}");
                s.create(&p, meta(false), b"", true).unwrap();
                present.insert(p);
            }
        }
        let mut ever = present.clone();
        let mut kept = present.clone();
        let mut got: Vec<String> = Vec::new();
        let mut after = String::new();
        let mut round = 0;
        loop {
            let (p, done) = page(&*s, "/r", None, &after, 37);
            if let Some(l) = p.last() {
                after = l.clone();
            }
            got.extend(p);
            if done {
                break;
            }
            // Remove some entries, create others (before and after the
            // cursor, in directories listed, being listed and not yet).
            round += 1;
            for d in [round % 20, (round * 7) % 20] {
                let gone = format!("/r/d{d:02}/f{:02}", (round * 3) % 30);
                if present.remove(&gone) {
                    s.remove(&gone, 0, &mut |_| Ok(())).unwrap();
                    kept.remove(&gone);
                }
                let new = format!("/r/d{d:02}/g{round:03}");
                s.create(&new, meta(false), b"", false).unwrap();
                present.insert(new.clone());
                ever.insert(new);
            }
        }
        assert!(got.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
        for p in &kept {
            assert!(got.contains(p), "{p} present throughout and not listed");
        }
        for p in &got {
            assert!(ever.contains(p), "{p} never existed");
        }
    }
}

#[test]
fn tree_listing_types_follow_an_entry_replaced() {
    for (s, _dir) in engines() {
        s.create("/k/x", meta(false), b"", true).unwrap();
        s.create("/k/short-name-of-21-by", meta(true), b"", true)
            .unwrap();
        s.create(&format!("/k/{}", "y".repeat(40)), meta(false), b"", true)
            .unwrap();
        let kinds = |s: &dyn Store| {
            let mut v = Vec::new();
            s.list_tree("/k", None, "", 100, false, false, &mut |p, k, _| {
                v.push((p.to_string(), k))
            })
            .unwrap();
            v
        };
        assert_eq!(kinds(&*s)[1], ("/k/x".to_string(), 8));
        assert_eq!(kinds(&*s)[0].1, 4);
        assert_eq!(kinds(&*s)[2].1, 8);
        // Removed and made again as a directory; a chunk put over it.
        s.remove("/k/x", 0, &mut |_| Ok(())).unwrap();
        s.create("/k/x", meta(true), b"", true).unwrap();
        assert_eq!(kinds(&*s)[1], ("/k/x".to_string(), 4));
        let c = crate::Chunk {
            meta: meta(false),
            data: bytes::Bytes::new(),
        };
        s.put("/k/x", 0, c).unwrap();
        assert_eq!(kinds(&*s)[1], ("/k/x".to_string(), 8));
    }
}

/// Directory keys read by one call of `f` on this thread.
fn keys_visited(f: impl FnOnce()) -> usize {
    use crate::dirindex::KEYS_VISITED;
    let before = KEYS_VISITED.with(|c| c.get());
    f();
    KEYS_VISITED.with(|c| c.get()) - before
}

/// A page reads the directory keys of what it lists (and a few more),
/// not every directory of the store: a small subtree beside 2,000
/// directories, listed whole, in pages, resumed deep inside it, with the
/// skipped area inside it, and after a restart of the persistent engines.
#[test]
fn tree_listing_reads_only_the_directories_it_lists_from() {
    let check = |s: &dyn Store, ctx: &str| {
        // The subtree: /m/s and 4 directories below it, 17 entries listed
        // from 5 directories.
        let want: Vec<String> = {
            let mut v = vec!["/m/s/a".to_string()];
            for d in ["b", "b/c", "b/c/d", "e"] {
                v.push(format!("/m/s/{d}"));
                for f in 0..3 {
                    v.push(format!("/m/s/{d}/f{f}"));
                }
            }
            v.sort();
            v
        };
        let mut got = Vec::new();
        let n = keys_visited(|| got = all(s, "/m/s", None, 100));
        assert_eq!(got, want, "{ctx}");
        // `all` lists twice (with and without headers); each listing
        // reads the 5 keys and the next one, /m/z0000/ (before: 4,012).
        assert!(n <= 2 * (5 + 1), "{ctx}: {n} keys read for 5 directories");
        let n = keys_visited(|| got = all(s, "/m/s", None, 2));
        assert_eq!(got, want, "{ctx}");
        // 9 pages: each reads a few keys ahead and looks up the
        // ancestors of where it resumes.
        assert!(n <= 2 * 9 * (5 + 4), "{ctx}: {n} keys read in pages");
        let n = keys_visited(|| {
            got = page(s, "/m/s", None, "/m/s/b/c/d/f0", 100).0;
        });
        assert_eq!(got[0], "/m/s/b/c/d/f1", "{ctx}");
        // 4 ancestors looked up, /m/s/e/ and /m/z0000/ read.
        assert!(n <= 2 * (4 + 2), "{ctx}: {n} keys read to resume");
        let n = keys_visited(|| got = all(s, "/m/s", Some("/m/s/b/c"), 100));
        let kept: Vec<String> = want
            .iter()
            .filter(|p| !p.starts_with("/m/s/b/c/"))
            .cloned()
            .collect();
        assert_eq!(got, kept, "{ctx}");
        // The skipped key is read once: the rest of its area is passed
        // over in one step.
        assert!(n <= 2 * (5 + 1), "{ctx}: {n} keys read with a skip");
    };
    let fill = |s: &dyn Store| {
        for i in 0..1000 {
            s.create(&format!("/m/r{i:04}/x"), meta(false), b"", true)
                .unwrap();
            s.create(&format!("/m/z{i:04}/x"), meta(false), b"", true)
                .unwrap();
        }
        s.create("/m/s", meta(true), b"", true).unwrap();
        s.create("/m/s/a", meta(false), b"", true).unwrap();
        for d in ["b", "b/c", "b/c/d", "e"] {
            s.create(&format!("/m/s/{d}"), meta(true), b"", true)
                .unwrap();
            for f in 0..3 {
                s.create(&format!("/m/s/{d}/f{f}"), meta(false), b"", true)
                    .unwrap();
            }
        }
    };
    for (s, _dir) in engines() {
        fill(&*s);
        check(&*s, "open");
    }
    let pd = tempfile::tempdir().unwrap();
    let f = pd.path().join("s.pmem");
    fill(&crate::PmemStore::open(&f, 8 << 20).unwrap());
    check(&crate::PmemStore::open(&f, 0).unwrap(), "pmem restarted");
    let xd = tempfile::tempdir().unwrap();
    fill(&crate::PosixStore::open(xd.path(), 0).unwrap());
    check(
        &crate::PosixStore::open(xd.path(), 0).unwrap(),
        "posix restarted",
    );
}

/// Pages of random listings (directory, skipped area, resume point, page
/// size) against a model over random paths, some not normalised (as a
/// damaged medium may give back: "a//b", no leading `/`): each entry is
/// listed as its parent's key and its name, when its parent is at or
/// below the directory and not at or below the skipped one.
#[test]
fn tree_listing_matches_a_model_of_random_paths() {
    use chfs_proto::path::parent;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let parts = ["a", "b", "a.b", "a-", "é", "", "ab"];
    let s = crate::MemStore::new(0);
    let mut paths = BTreeSet::new();
    for _ in 0..600 {
        let depth = 1 + rnd(5);
        // Without a leading `/` (at least 2 deep: "é" would be listed as
        // "/é", as is "/é" itself).
        let mut p = if rnd(10) == 0 && depth > 1 {
            String::new()
        } else {
            "/".to_string()
        };
        for i in 0..depth {
            if i > 0 {
                p.push('/');
            }
            // Not "" first: "//x" is listed as "/x", as is "/x".
            p.push_str(parts[if i == 0 { rnd(5) } else { rnd(parts.len()) }]);
        }
        if p.is_empty() || p.ends_with('/') {
            continue;
        }
        s.create(&p, meta(rnd(2) == 0), b"", false).unwrap();
        paths.insert(p);
    }
    // Some removed again (directories losing their last entry).
    for p in paths.clone() {
        if rnd(4) == 0 {
            s.remove(&p, 0, &mut |_| Ok(())).unwrap();
            paths.remove(&p);
        }
    }
    let listed = |p: &str| {
        let d = parent(p);
        let name = p.rsplit('/').next().unwrap_or(p);
        (d.to_string(), crate::dirindex::key_of(d) + name)
    };
    let dirs = ["/", "/a", "/a/a.b", "/b", "a", "/é", "/a-", "/nothing"];
    for round in 0..300 {
        let dir = dirs[rnd(dirs.len())];
        let skip = [None, Some("/a/a"), Some("/a"), Some("/b/b"), Some("a/b")][rnd(5)];
        let max = [1, 2, 5, 50, 1000][rnd(5)];
        let want: Vec<String> = paths
            .iter()
            .map(|p| listed(p))
            .filter(|(d, _)| is_within(d, dir) && !skip.is_some_and(|sk| is_within(d, sk)))
            .map(|(_, p)| p)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // From the start, or after a path listed or not.
        let after = match rnd(3) {
            0 => String::new(),
            1 if !want.is_empty() => want[rnd(want.len())].clone(),
            _ => listed(paths.iter().nth(rnd(paths.len())).unwrap()).1 + "a",
        };
        let mut got = Vec::new();
        let mut at = after.clone();
        loop {
            let (p, done) = page(&s, dir, skip, &at, max);
            if let Some(l) = p.last() {
                at = l.clone();
            }
            got.extend(p);
            if done {
                break;
            }
        }
        let want: Vec<String> = want.into_iter().filter(|p| *p > after).collect();
        assert_eq!(
            got, want,
            "round {round}: {dir} {skip:?} after {after:?} max {max}"
        );
    }
}
