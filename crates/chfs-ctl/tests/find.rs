//! chfind against GNU find: the same tree of 100,000 entries built in a
//! chfs-rs pool (3 real chfsd servers) and in a local directory must give
//! exactly the same answers.

mod common;
mod find_tree;

use std::process::Command;
use std::time::Instant;

use chfs_localpool::LocalPool;
use common::*;
use find_tree::*;

const ENTRIES: usize = 100_000;

#[test]
fn chfind_matches_gnu_find_on_100k_entries() {
    let pool = LocalPool::start(3).expect("start chfsd pool");
    let c = connect(&pool);
    let tmp = local_dir();
    let local = tmp.path();
    let t0 = Instant::now();
    let n = build(&c, local, ENTRIES);
    assert_eq!(n, ENTRIES);
    eprintln!("built {n} entries twice in {:?}", t0.elapsed());

    let server = pool.server_string();
    let env = [("CHFS_SERVER", server.as_str())];
    let lroot = local.join("t");
    let lroot = lroot.to_str().unwrap();
    // REF: a file with an old time (BASE + 300), so about half of the
    // old-timed entries are newer.
    let refi = 300;
    assert_eq!(refi % 5, 0);
    let lref = format!("{}/{}/{}", local.display(), file_dir(refi), file_name(refi));
    let cref = format!("/{}/{}", file_dir(refi), file_name(refi));
    let queries: Vec<Vec<&str>> = vec![
        vec![],
        vec!["-name", "*01*"],
        vec!["-name", ".h*"],
        vec!["-name", "f0[0-2]?1[!5]*"],
        vec!["-type", "d"],
        vec!["-type", "l"],
        vec!["-type", "f", "-size", "3901c"],
        vec!["-type", "f", "-size", "+1k"],
        vec!["-type", "f", "-size", "-1"],
        vec!["-type", "f", "-size", "2"],
        vec!["-type", "f", "-newer", "REF"],
        vec!["-type", "d", "-newer", "REF"],
        vec![
            "-newer", "REF", "-size", "3901c", "-name", "*01*", "-type", "f",
        ],
    ];
    for q in &queries {
        let cq: Vec<&str> = q
            .iter()
            .map(|a| if *a == "REF" { cref.as_str() } else { a })
            .collect();
        let lq: Vec<&str> = q
            .iter()
            .map(|a| if *a == "REF" { lref.as_str() } else { a })
            .collect();
        let t = Instant::now();
        let out = Command::new(bin("chfind"))
            .arg("/t")
            .args(&cq)
            .env("CHFS_SERVER", &server)
            .output()
            .unwrap();
        let ct = t.elapsed();
        assert_eq!(out.status.code(), Some(0), "{q:?}: {}", text(&out.stderr));
        let t = Instant::now();
        let gout = Command::new("find").arg(lroot).args(&lq).output().unwrap();
        let gt = t.elapsed();
        assert!(gout.status.success(), "find {q:?}");
        let mine = sorted_lines(&text(&out.stdout), "");
        let gnu = sorted_lines(&text(&gout.stdout), local.to_str().unwrap());
        eprintln!(
            "{q:?}: {} matches (chfind {ct:?}, GNU find on local dir {gt:?})",
            gnu.len()
        );
        if mine != gnu {
            let only_mine: Vec<_> = mine
                .iter()
                .filter(|l| gnu.binary_search(l).is_err())
                .take(5)
                .collect();
            let only_gnu: Vec<_> = gnu
                .iter()
                .filter(|l| mine.binary_search(l).is_err())
                .take(5)
                .collect();
            panic!(
                "{q:?}: chfind {} vs find {} matches; only chfind: {only_mine:?}; only find: {only_gnu:?}",
                mine.len(),
                gnu.len()
            );
        }
        assert!(!gnu.is_empty(), "{q:?} matched nothing: a weak query");
    }
    // -q prints the count (IO500's find phase reads it).
    let io500 = &queries[queries.len() - 1];
    let cq: Vec<&str> = io500
        .iter()
        .map(|a| if *a == "REF" { cref.as_str() } else { a })
        .collect();
    let lq: Vec<&str> = io500
        .iter()
        .map(|a| if *a == "REF" { lref.as_str() } else { a })
        .collect();
    let out = run(&bin("chfind"), &[&["-q", "/t"][..], &cq].concat(), &env);
    let gnu = Command::new("find").arg(lroot).args(&lq).output().unwrap();
    let count = text(&gnu.stdout).lines().count();
    assert_eq!(
        text(&out.stdout).trim(),
        format!("MATCHED {count}/{ENTRIES}")
    );
}
