//! The test tree of chfind's tests (find.rs, find_mpi.rs), built the same
//! way in a chfs-rs pool and in a local directory for GNU find.
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use chfs_client::{Client, ClientConfig, TimeSet};
use chfs_localpool::LocalPool;

pub const TOPS: usize = 20;
pub const SUBS: usize = 10;
pub const LINKS: usize = 20;
pub const BASE: i64 = 1_700_000_000;
pub const SIZES: [u64; 8] = [1, 511, 512, 513, 1024, 1025, 3901, 70_000];

pub fn set_local_mtime(p: &Path, secs: i64) {
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

pub fn set_chfs_mtime(c: &Client, p: &str, secs: i64) {
    let t = TimeSet::At(secs * 1_000_000_000);
    c.utimens(p, t, t).unwrap();
}

/// Directory of file number `i`, relative to the root ("t/...").
pub fn file_dir(i: usize) -> String {
    let top = i % TOPS;
    match (i / TOPS) % (SUBS + 1) {
        SUBS => format!("t/d{top:02}"),
        s => format!("t/d{top:02}/s{s}"),
    }
}

pub fn file_name(i: usize) -> String {
    if i.is_multiple_of(97) {
        format!(".h{i:06}")
    } else {
        format!("f{i:06}.dat")
    }
}

/// Builds the same tree of `entries` entries (directories, files of
/// several sizes and times, symbolic links) under `/t` in the pool and under
/// `local/t`; returns the number of entries.
pub fn build(c: &Client, local: &Path, entries: usize) -> usize {
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
    let files = entries - dirs.len() - LINKS;
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

/// A client of `pool` with a generous request timeout (building the tree
/// keeps the servers busy).
pub fn connect(pool: &LocalPool) -> Client {
    let mut cfg = ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    };
    cfg.rpc_timeout = std::time::Duration::from_secs(30);
    Client::connect(cfg).unwrap()
}

/// An empty local directory for GNU find's copy of the tree, on tmpfs when
/// there is one (a disk-backed /tmp makes 100,000 creates slow).
pub fn local_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Lines as printed (not deduplicated), with `strip` removed in front,
/// sorted.
pub fn sorted_lines(s: &str, strip: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .map(|l| l.strip_prefix(strip).unwrap_or(l).to_string())
        .collect();
    v.sort();
    v
}
