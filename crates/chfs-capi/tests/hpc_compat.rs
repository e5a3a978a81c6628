//! The C compatibility suite: libchfs driven exactly as the CHFS backend of
//! IOR / mdtest (aiori-CHFS.c) drives it — its own open-flag constants
//! (read-only 0x01, write-only 0x02, create 0x10, truncate 0x20) passed to
//! `chfs_create` / `chfs_open` — by C programs built with
//! `pkg-config --cflags --libs chfs` against an installed PREFIX, one
//! process per benchmark rank, against real `chfsd` servers on loopback.
//! The programs are in `tests/c/hpc_backend.c`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use chfs_localpool::LocalPool;
use common::{check, clean, run, rust_client, Prefix};

/// One running rank: its process and the pipes of the barrier.
struct Rank {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Rank {
    fn wait_for(&mut self, step: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read rank stdout");
        assert_eq!(line.trim(), step, "rank did not reach {step}");
    }

    fn go(&mut self) {
        self.stdin.write_all(b"go\n").expect("release rank");
        self.stdin.flush().unwrap();
    }

    fn finish(mut self) {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "rank failed ({st}): {rest}");
        assert_eq!(rest, "hpc_backend: ok\n");
    }
}

fn spawn_rank(exe: &Path, pool: &LocalPool, args: &[String]) -> Rank {
    let mut child = clean(exe)
        .env("CHFS_SERVER", pool.server_string())
        .env("HPC_BARRIER", "1")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rank");
    let stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    Rank {
        child,
        stdin,
        stdout,
    }
}

fn ok(out: std::process::Output) {
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hpc_backend: ok\n");
    assert!(
        out.stderr.is_empty(),
        "library printed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One IOR phase pair: every rank creates (all of them, as IOR does, with
/// 0x02|0x10|0x20), writes its blocks and fsyncs; while the writers still
/// hold their files open, a second process per rank opens with 0x01 and
/// reads back what another rank wrote; then the writers close. `paths[r]`
/// is rank r's file (all the same for a shared file).
fn ior_round(
    exe: &Path,
    pool: &LocalPool,
    paths: &[String],
    xfer: usize,
    segs: usize,
    layout: &str,
    chunk: Option<u32>,
) {
    let n = paths.len();
    let mut ranks: Vec<Rank> = (0..n)
        .map(|r| {
            let mut a: Vec<String> = vec![
                "write".into(),
                paths[r].clone(),
                r.to_string(),
                n.to_string(),
                xfer.to_string(),
                segs.to_string(),
                layout.into(),
            ];
            a.extend(chunk.map(|c| c.to_string()));
            spawn_rank(exe, pool, &a)
        })
        .collect();
    // MPI_Barrier after the create (IOR -g): no rank writes before every
    // rank's create-or-truncate is done.
    ranks.iter_mut().for_each(|r| r.wait_for("created"));
    ranks.iter_mut().for_each(Rank::go);
    ranks.iter_mut().for_each(|r| r.wait_for("synced"));
    for r in 0..n {
        let writer = (r + 1) % n;
        ok(check(
            clean(exe)
                .env("CHFS_SERVER", pool.server_string())
                .args(["read", &paths[writer], &writer.to_string()])
                .args([n.to_string(), xfer.to_string(), segs.to_string()])
                .arg(layout),
        ));
    }
    ranks.iter_mut().for_each(Rank::go);
    ranks.into_iter().for_each(Rank::finish);
}

#[test]
fn ior_file_per_process_and_shared_file_with_the_benchmarks_flags() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("hpc_backend", tmp.path());
    let pool = p.pool(3);
    let c = rust_client(&pool);
    c.mkdir("/ior", 0o755).unwrap();
    let n = 3;

    // ior-easy: a file per process, transfers crossing chunk boundaries,
    // chunk size set by chfs_set_chunk_size before chfs_init (IOR's
    // --chfs.chunk_size).
    let fpp: Vec<String> = (0..n).map(|r| format!("/ior/easy.{r:08}")).collect();
    let (xfer, segs, chunk) = (300_000, 6, 262_144);
    ior_round(&exe, &pool, &fpp, xfer, segs, "fpp", Some(chunk));
    for f in &fpp {
        let st = c.stat(f).unwrap();
        assert_eq!((st.size, st.blksize), ((xfer * segs) as u64, chunk));
    }
    // A second write phase over the existing files: create truncates.
    ior_round(&exe, &pool, &fpp, 100_000, 2, "fpp", Some(chunk));
    assert_eq!(c.stat(&fpp[0]).unwrap().size, 200_000);

    // ior-hard: one shared file, 47,008-byte transfers of every rank
    // interleaved, so ranks write the same 64 KiB chunks.
    let shared = vec!["/ior/hard".to_string(); n];
    ior_round(&exe, &pool, &shared, 47_008, 10, "shared", None);
    assert_eq!(c.stat("/ior/hard").unwrap().size, 3 * 10 * 47_008);

    // The same read-back with open(2) flags: 0x01 is O_WRONLY there, so
    // every read fails with EBADF, as it did before CHFS's conventions
    // became the default.
    let out = run(clean(&exe)
        .env("CHFS_SERVER", pool.server_string())
        .env("CHFS_POSIX_FLAGS", "1")
        .args(["read", "/ior/hard", "1", "3", "47008", "10", "shared"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot read from file /ior/hard")
            && err.contains("Bad file descriptor")
            && err.contains("chfs_pread"),
        "{err}"
    );

    // Removal as IOR does it after the read phase.
    for f in fpp.iter().chain(&shared[..1]) {
        ok(check(
            clean(&exe)
                .env("CHFS_SERVER", pool.server_string())
                .args(["unlink", f]),
        ));
    }
    assert!(c.readdir("/ior").unwrap().is_empty());
}

fn mdtest_phase(exe: &Path, pool: &LocalPool, phase: &str, rank: usize, n: usize, size: usize) {
    ok(check(
        clean(exe)
            .env("CHFS_SERVER", pool.server_string())
            .args(["mdtest", phase, "/md", &rank.to_string()])
            .args([n.to_string(), size.to_string()]),
    ));
}

#[test]
fn mdtest_metadata_loop_in_one_directory() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("hpc_backend", tmp.path());
    let pool = p.pool(2);
    let c = rust_client(&pool);
    // mdtest-hard: 3,901-byte files of two ranks in one directory, then
    // 0-byte files (mdtest-easy's size). Every phase runs in new processes,
    // one per rank, as mdtest's phases follow each other.
    for (files, size) in [(1500, 3901), (500, 0)] {
        mdtest_phase(&exe, &pool, "mkdir", 0, 0, 0);
        std::thread::scope(|s| {
            for rank in 0..2 {
                let (exe, pool) = (&exe, &pool);
                s.spawn(move || mdtest_phase(exe, pool, "create", rank, files, size));
            }
        });
        assert_eq!(
            c.readdir("/md/tree.0/tree.1").unwrap().len(),
            2 * files,
            "entries in the shared directory"
        );
        for phase in ["stat", "read", "delete"] {
            std::thread::scope(|s| {
                for rank in 0..2 {
                    let (exe, pool) = (&exe, &pool);
                    s.spawn(move || mdtest_phase(exe, pool, phase, rank, files, size));
                }
            });
        }
        mdtest_phase(&exe, &pool, "rmdir", 0, 0, 0);
    }
    assert!(c.readdir("/").unwrap().is_empty());
}
