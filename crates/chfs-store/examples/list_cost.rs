//! Cost of listing directories in the DRAM engine: `dirs` directories of
//! `per_dir` empty files (as python/bench.py's tree, on one server), every
//! directory listed in pages of 4096 names, `rounds` times; prints the best
//! round's ns per listed entry.
//!
//!     cargo run --release -p chfs-store --example list_cost [dirs] [per_dir] [rounds]

use std::time::Instant;

use chfs_proto::Meta;
use chfs_store::{MemStore, Store};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a number"));
    let dirs = args.next().unwrap_or(100);
    let per_dir = args.next().unwrap_or(500);
    let rounds = args.next().unwrap_or(20);
    let st = MemStore::new(0);
    let dir = Meta {
        mode: libc::S_IFDIR | 0o755,
        ..Meta::default()
    };
    let file = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 65536,
        ..Meta::default()
    };
    st.create("/tree", dir, &[], true).expect("create");
    // Interleaved as a parallel create would leave them in memory.
    for d in 0..dirs {
        st.create(&format!("/tree/d{d:04}"), dir, &[], true)
            .expect("mkdir");
    }
    for i in 0..per_dir {
        for d in 0..dirs {
            st.create(&format!("/tree/d{d:04}/f{i:05}"), file, &[], true)
                .expect("create");
        }
    }
    let mut best = f64::MAX;
    let mut listed = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        listed = 0;
        for d in 0..dirs {
            let path = format!("/tree/d{d:04}");
            let mut after = String::new();
            loop {
                let (page, done) = st.list_dir(&path, &after, 4096).expect("list");
                listed += page.len();
                if let Some((n, _)) = page.last() {
                    after.clone_from(n);
                }
                std::hint::black_box(&page);
                if done {
                    break;
                }
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert_eq!(listed, dirs * per_dir);
    println!(
        "{listed} entries listed: best round {:.2} ms, {:.0} ns per entry",
        best * 1e3,
        best * 1e9 / listed as f64
    );
}
