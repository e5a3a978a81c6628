//! chfind under `mpirun -n 3` against GNU find: a tree of 20,000 entries in
//! a pool of 4 real chfsd servers (so the ranks own 2, 1 and 1 servers) and
//! in a local directory; and under `mpirun -n 2` with servers that refuse
//! directory listings (the ranks list trees). The lines printed by all ranks together must be
//! GNU find's, each exactly once, and `-q` prints one total on rank 0.
//! And the other way round: a chfind started by an MPI program (IO500's
//! find phase) inherits the launcher's variables and must run alone.
#![cfg(feature = "mpi")]

mod common;
mod find_tree;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
    chfind_under_mpirun_matches_gnu_find_over(None);
}

// The same with the servers and every rank's client over libfabric.
over_ofi_tcp!(
    chfind_under_mpirun_matches_gnu_find_over_ofi_tcp,
    chfind_under_mpirun_matches_gnu_find_over
);

fn chfind_under_mpirun_matches_gnu_find_over(protocol: Option<&str>) {
    matches_gnu_find(pool_over(4, vec![], protocol), 3);
}

/// The ranks list trees (as IO500 runs chfind, `mpirun -n 2`, each rank
/// owning 2 of the 4 servers): servers that refuse every directory
/// listing (`Readdir`, `ReaddirDirs`, as a server that does not know
/// them) still give GNU find's lines and counts.
#[test]
fn chfind_ranks_list_trees_not_directories() {
    let args = ["--unknown-op", "READDIR", "--unknown-op", "READDIR_DIRS"];
    let pool = pool_over(4, args.iter().map(|a| a.to_string()).collect(), None);
    matches_gnu_find(pool, 2);
}

/// `mpirun -n RANKS chfind` over `pool` (4 servers) against GNU find.
fn matches_gnu_find(pool: LocalPool, ranks: usize) {
    let c = connect(&pool);
    let tmp = local_dir();
    let local = tmp.path();
    assert_eq!(build(&c, local, ENTRIES), ENTRIES);
    // Every server holds part of the tree (so every rank has work).
    for i in 0..c.server_count() {
        let mine = c.list_tree_of("/t/d00", false, &|j| j == i).unwrap();
        assert!(!mine.unwrap().is_empty(), "server {i}");
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

        // chfind alone first (one process walks every server).
        let out = tool(
            &bin("chfind"),
            &[&["/t"][..], &cq].concat(),
            &[("CHFS_SERVER", &server)],
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{q:?}: {}", text(&out.stderr));
        assert!(
            sorted_lines(&text(&out.stdout), "") == gnu,
            "{q:?}: chfind alone differs from find"
        );

        let out = mpirun(ranks, &server, &[&["/t"][..], &cq].concat());
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
                "{q:?}: chfind -n {ranks} printed {} lines vs find {}; not in find: {only_mine:?}; twice: {dups:?}",
                mine.len(),
                gnu.len()
            );
        }

        // -q: one total, on rank 0, equal to GNU find's count.
        let out = mpirun(ranks, &server, &[&["-q", "/t"][..], &cq].concat());
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
    let out = mpirun(ranks, &server, &["-q", "/nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.matches("chfind: /nope").count(), 1, "{err}");
}

/// What IO500's find phase does with an external script, as a small MPI
/// program: every rank initialises MPI; rank 0 runs the command with
/// `popen`, reads its output with `fgets`, cuts the newline off the last
/// line and prints it; all ranks meet at a barrier.
const IO500_LIKE: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        char line[1024] = "";
        long lines = 0;
        FILE *fp = popen(argv[1], "r");
        if (fp == NULL)
            return 3;
        while (fgets(line, sizeof line, fp) != NULL)
            lines++;
        int st = pclose(fp);
        if (line[0] != '\0')
            line[strlen(line) - 1] = '\0';
        printf("status %d lines %ld last %s\n", st, lines, line);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
"#;

/// Runs `cmd`, stopping it (SIGTERM, then SIGKILL, by its PID) if it runs
/// longer than `limit`: a chfind that took itself for an MPI rank would
/// wait for peers that never come.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r.expect("wait"),
        Err(_) => {
            // SAFETY: kill(2) on the PID of the child spawned above, not yet
            // reaped (its waiting thread still waits).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let out = rx.recv_timeout(Duration::from_secs(10)).ok();
            if out.is_none() {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("{cmd:?} still running after {limit:?}: {out:?}");
        }
    }
}

#[test]
fn chfind_started_by_an_mpi_rank_runs_alone() {
    let pool = LocalPool::start(3).expect("start chfsd pool");
    let c = connect(&pool);
    let tmp = local_dir();
    let local = tmp.path();
    let entries = 3000;
    assert_eq!(build(&c, local, entries), entries);
    let server = pool.server_string();
    let refi = 300;
    let lref = format!("{}/{}/{}", local.display(), file_dir(refi), file_name(refi));
    let gout = Command::new("find")
        .arg(local.join("t"))
        .args(["-newer", &lref, "-size", "3901c", "-name", "*01*"])
        .output()
        .unwrap();
    let want = text(&gout.stdout).lines().count();
    assert!(want > 0, "a weak query");

    let exe = tmp.path().join("io500_like");
    let src = tmp.path().join("io500_like.c");
    std::fs::write(&src, IO500_LIKE).unwrap();
    let cc = Command::new("mpicc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("mpicc (apt package libopenmpi-dev)");
    assert!(cc.status.success(), "mpicc: {}", text(&cc.stderr));

    // IO500's command: external-script, then DATADIR -newer FILE (a local
    // file here, looked up in the pool first) -size 3901c -name "*01*".
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/io500-chfind.sh")
        .canonicalize()
        .expect("scripts/io500-chfind.sh");
    let command = format!(
        " {}  /t -newer {lref} -size 3901c -name \"*01*\"",
        wrapper.display()
    );
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .args(["-x", "CHFS_SERVER", "-x", "CHFIND"])
        .arg(&exe)
        .arg(&command)
        .env("CHFS_SERVER", &server)
        .env("CHFIND", bin("chfind"))
        .env_remove("CHFIND_MPI");
    let t = Instant::now();
    let out = output_within(cmd, Duration::from_secs(120));
    eprintln!(
        "mpirun -n 2 io500_like ({:.2} s): {}\n{}",
        t.elapsed().as_secs_f64(),
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("status 0 lines 1 last MATCHED {want}/{entries}")
    );
}
