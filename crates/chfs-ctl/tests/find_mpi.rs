//! chfind under `mpirun -n 3` against GNU find: a tree of 20,000 entries in
//! a pool of 4 real chfsd servers (so the ranks own 2, 1 and 1 servers) and
//! in a local directory. The lines printed by all ranks together must be
//! GNU find's, each exactly once, and `-q` prints one total on rank 0.
#![cfg(feature = "mpi")]

mod common;
mod find_tree;

use std::process::{Command, Output};

use chfs_localpool::LocalPool;
use common::*;
use find_tree::*;

const ENTRIES: usize = 20_000;

fn mpirun(ranks: usize, server: &str, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n"])
        .arg(ranks.to_string())
        .args(["-x", "CHFS_SERVER"])
        .arg(bin("chfind"))
        .args(args)
        .env("CHFS_SERVER", server)
        .output()
        .expect("run mpirun (apt package openmpi-bin)")
}

#[test]
fn chfind_under_mpirun_matches_gnu_find() {
    let pool = LocalPool::start(4).expect("start chfsd pool");
    let c = connect(&pool);
    let tmp = local_dir();
    let local = tmp.path();
    assert_eq!(build(&c, local, ENTRIES), ENTRIES);
    // Every server holds part of the tree (so every rank has work).
    for i in 0..c.server_count() {
        assert!(
            !c.readdir_index("/t/d00", i).unwrap().is_empty(),
            "server {i}"
        );
    }

    let server = pool.server_string();
    let lroot = local.join("t");
    let lroot = lroot.to_str().unwrap();
    let refi = 300;
    let lref = format!("{}/{}/{}", local.display(), file_dir(refi), file_name(refi));
    let cref = format!("/{}/{}", file_dir(refi), file_name(refi));
    let queries: Vec<Vec<&str>> = vec![
        vec![],
        vec!["-name", "*01*"],
        vec!["-type", "d"],
        vec!["-type", "l"],
        vec!["-type", "f", "-size", "+1k"],
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
        let gout = Command::new("find").arg(lroot).args(&lq).output().unwrap();
        assert!(gout.status.success(), "find {q:?}");
        let gnu = sorted_lines(&text(&gout.stdout), local.to_str().unwrap());
        assert!(!gnu.is_empty(), "{q:?} matched nothing: a weak query");

        let out = mpirun(3, &server, &[&["/t"][..], &cq].concat());
        assert_eq!(out.status.code(), Some(0), "{q:?}: {}", text(&out.stderr));
        let mine = sorted_lines(&text(&out.stdout), "");
        if mine != gnu {
            let only_mine: Vec<_> = mine
                .iter()
                .filter(|l| gnu.binary_search(l).is_err())
                .take(5)
                .collect();
            let dups: Vec<_> = mine.windows(2).filter(|w| w[0] == w[1]).take(5).collect();
            panic!(
                "{q:?}: chfind -n 3 printed {} lines vs find {}; not in find: {only_mine:?}; twice: {dups:?}",
                mine.len(),
                gnu.len()
            );
        }

        // -q: one total, on rank 0, equal to GNU find's count.
        let out = mpirun(3, &server, &[&["-q", "/t"][..], &cq].concat());
        assert_eq!(
            out.status.code(),
            Some(0),
            "-q {q:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            text(&out.stdout).trim(),
            format!("MATCHED {}/{ENTRIES}", gnu.len()),
            "-q {q:?}"
        );
    }

    // A missing starting point: one error (from rank 0), exit status 1.
    let out = mpirun(3, &server, &["-q", "/nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.matches("chfind: /nope").count(), 1, "{err}");
}
