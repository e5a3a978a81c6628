//! chfind against GNU find: the same tree of 100,000 entries built in a
//! chfs-rs pool (3 real chfsd servers) and in a local directory must give
//! exactly the same answers.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use chfs_client::{Client, ClientConfig, TimeSet};
use chfs_localpool::LocalPool;
use common::*;

const ENTRIES: usize = 100_000;
const TOPS: usize = 20;
const SUBS: usize = 10;
const LINKS: usize = 20;
const BASE: i64 = 1_700_000_000;
const SIZES: [u64; 8] = [1, 511, 512, 513, 1024, 1025, 3901, 70_000];

fn set_local_mtime(p: &Path, secs: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    ];
    // SAFETY: c is a valid NUL-terminated path and ts an array of two
    // timespecs, both alive across the call.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat {}", p.display());
}

fn set_chfs_mtime(c: &Client, p: &str, secs: i64) {
    let t = TimeSet::At(secs * 1_000_000_000);
    c.utimens(p, t, t).unwrap();
}

/// Directory of file number `i`, relative to the root ("t/...").
fn file_dir(i: usize) -> String {
    let top = i % TOPS;
    match (i / TOPS) % (SUBS + 1) {
        SUBS => format!("t/d{top:02}"),
        s => format!("t/d{top:02}/s{s}"),
    }
}

fn file_name(i: usize) -> String {
    if i.is_multiple_of(97) {
        format!(".h{i:06}")
    } else {
        format!("f{i:06}.dat")
    }
}

fn build(c: &Client, local: &Path) -> usize {
    let mut dirs = vec!["t".to_string()];
    for t in 0..TOPS {
        dirs.push(format!("t/d{t:02}"));
        for s in 0..SUBS {
            dirs.push(format!("t/d{t:02}/s{s}"));
        }
    }
    for d in &dirs {
        c.mkdir(&format!("/{d}"), 0o755).unwrap();
        std::fs::create_dir(local.join(d)).unwrap();
    }
    let files = ENTRIES - dirs.len() - LINKS;
    let threads = 6;
    std::thread::scope(|s| {
        for w in 0..threads {
            let c = c.clone();
            s.spawn(move || {
                for i in (w..files).step_by(threads) {
                    let rel = format!("{}/{}", file_dir(i), file_name(i));
                    let size = if i % 10 == 0 {
                        SIZES[(i / 10) % SIZES.len()]
                    } else {
                        0
                    };
                    let mtime = BASE + (i % 600) as i64;
                    let p = format!("/{rel}");
                    let fd = c.create(&p, libc::O_WRONLY, 0o644).unwrap();
                    if size > 0 {
                        c.ftruncate(fd, size).unwrap();
                    }
                    c.close(fd).unwrap();
                    let lp = local.join(&rel);
                    let f = std::fs::File::create(&lp).unwrap();
                    if size > 0 {
                        f.set_len(size).unwrap();
                    }
                    drop(f);
                    // One file in five gets an old time around REF's; the
                    // others keep "now" on both sides (newer than REF).
                    if i.is_multiple_of(5) {
                        set_chfs_mtime(&c, &p, mtime);
                        set_local_mtime(&lp, mtime);
                    }
                }
            });
        }
    });
    for k in 0..LINKS {
        let rel = format!("t/d{:02}/link{k}", k % TOPS);
        c.symlink("s0", &format!("/{rel}")).unwrap();
        std::os::unix::fs::symlink("s0", local.join(&rel)).unwrap();
    }
    // Directory times last (creating entries changes them locally).
    for (k, d) in dirs.iter().enumerate() {
        let m = BASE + (k * 7 % 600) as i64;
        set_chfs_mtime(c, &format!("/{d}"), m);
        set_local_mtime(&local.join(d), m);
    }
    dirs.len() + files + LINKS
}

fn sorted_lines(s: &str, strip: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .map(|l| l.strip_prefix(strip).unwrap_or(l).to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn chfind_matches_gnu_find_on_100k_entries() {
    let pool = LocalPool::start(3).expect("start chfsd pool");
    let mut cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    };
    cfg.rpc_timeout = std::time::Duration::from_secs(30);
    let c = Client::connect(cfg).unwrap();
    // The local tree on tmpfs when there is one (a disk-backed /tmp makes
    // 100,000 creates slow).
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let local = tmp.path();
    let t0 = Instant::now();
    let n = build(&c, local);
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
