//! What a tree listing costs beside many directories, and what the
//! directory index adds to creates and removals: a DRAM store holding
//! `DIRS` directories (one file each), a 100-entry subtree listed whole
//! (one page, as a server answers `ListTree`), then creates and removals
//! of files in new directories (each adds and drops a directory key) and
//! in one directory (after those in new directories, unless ONE_FIRST is
//! set: the keys made and dropped there leave a heap on which the creates
//! in one directory measured ~100-200 ns slower than before the ordered
//! directory keys, the same when run first).
//!
//! `cargo run --release -p chfs-store --example tree_scan [DIRS]`

use std::time::Instant;

use chfs_proto::Meta;
use chfs_store::{MemStore, Store};

fn meta(dir: bool) -> Meta {
    Meta {
        mode: if dir {
            libc::S_IFDIR | 0o755
        } else {
            libc::S_IFREG | 0o644
        },
        chunk_size: 1 << 16,
        fileid: 1,
        ..Default::default()
    }
}

fn per_op(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

fn main() {
    let dirs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let s = MemStore::new(0);
    let t = Instant::now();
    for i in 0..dirs {
        let d = format!("/pool/d{:03}/e{i:07}", i % 1000);
        s.create(&d, meta(true), b"", true).unwrap();
        s.create(&format!("{d}/f"), meta(false), b"", true).unwrap();
    }
    let fill = per_op(t, 2 * dirs);
    // The subtree: 10 directories of 9 files each.
    for d in 0..10 {
        s.create(&format!("/pool/sub/d{d}"), meta(true), b"", true)
            .unwrap();
        for f in 0..9 {
            s.create(&format!("/pool/sub/d{d}/f{f}"), meta(false), b"", true)
                .unwrap();
        }
    }
    for with_meta in [false, true] {
        let mut best = f64::MAX;
        let mut total = 0.0;
        let rounds = 200;
        for _ in 0..rounds {
            let mut n = 0;
            let t = Instant::now();
            let done = s
                .list_tree(
                    "/pool/sub",
                    None,
                    "",
                    65_536,
                    with_meta,
                    false,
                    &mut |_, _, _| n += 1,
                )
                .unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6;
            assert!(done);
            assert_eq!(n, 100);
            best = best.min(us);
            total += us;
        }
        println!(
            "list_tree of 100 entries beside {dirs} directories (headers {with_meta}): best {best:.1} us, mean {:.1} us",
            total / rounds as f64
        );
    }
    let n = 100_000;
    let in_new = || {
        let t = Instant::now();
        for i in 0..n {
            s.create(&format!("/new/d{i:06}/f"), meta(false), b"", true)
                .unwrap();
        }
        let create = per_op(t, n);
        let t = Instant::now();
        for i in 0..n {
            s.remove(&format!("/new/d{i:06}/f"), 0, &mut |_| Ok(()))
                .unwrap();
        }
        (create, per_op(t, n))
    };
    let in_one = || {
        let t = Instant::now();
        for i in 0..n {
            s.create(&format!("/one/f{i:06}"), meta(false), b"", true)
                .unwrap();
        }
        let create = per_op(t, n);
        let t = Instant::now();
        for i in 0..n {
            s.remove(&format!("/one/f{i:06}"), 0, &mut |_| Ok(()))
                .unwrap();
        }
        (create, per_op(t, n))
    };
    // ONE_FIRST=1: the phase in one directory first (heap layout check).
    let ((create_new, remove_last), (create_one, remove_one)) =
        if std::env::var_os("ONE_FIRST").is_some() {
            let one = in_one();
            (in_new(), one)
        } else {
            let new = in_new();
            (new, in_one())
        };
    println!(
        "ns per op: fill {fill:.0}; file in a new directory: create {create_new:.0}, remove {remove_last:.0}; in one directory: create {create_one:.0}, remove {remove_one:.0}"
    );
}
