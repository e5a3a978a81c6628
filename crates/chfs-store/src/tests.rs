//! Engine conformance tests, run against every engine.

use std::sync::Arc;

use chfs_proto::Meta;

use crate::fault::{CrashKind, FaultMedia};
use crate::{MemStore, PmemStore, PosixStore, Store, StoreError};

fn file_meta(fileid: u32) -> Meta {
    Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 1024,
        fileid,
        ..Default::default()
    }
}

/// A store and the scratch directory it lives in (removed on drop).
pub(crate) type Engine = (Arc<dyn Store>, Option<tempfile::TempDir>);

/// A scratch directory on tmpfs when there is one.
pub(crate) fn shm_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Every engine: DRAM, pmem on a tmpfs file, pmem on the fault model (no
/// fault), POSIX on a disk directory.
pub(crate) fn engines() -> Vec<Engine> {
    let pd = shm_dir();
    let pmem = PmemStore::open(&pd.path().join("s.pmem"), 8 << 20).unwrap();
    let fault = PmemStore::with_media(
        Box::new(FaultMedia::new(8 << 20, 0, CrashKind::Kill, 1)),
        true,
    )
    .unwrap();
    let xd = tempfile::tempdir().unwrap();
    let posix = PosixStore::open(xd.path(), 0).unwrap();
    vec![
        (Arc::new(MemStore::new(0)), None),
        (Arc::new(pmem), Some(pd)),
        (Arc::new(fault), None),
        (Arc::new(posix), Some(xd)),
    ]
}

#[test]
fn create_is_exclusive_on_request() {
    for (s, _dir) in engines() {
        let m = file_meta(1);
        assert!(s.create("/a", m, b"", true).unwrap().1);
        assert!(matches!(
            s.create("/a", m, b"", true),
            Err(StoreError::Exists(_))
        ));
        let (got, created) = s.create("/a", file_meta(2), b"", false).unwrap();
        assert!(!created);
        assert_eq!(got.fileid, 1);
    }
}

#[test]
fn writes_grow_entry_size_and_read_back() {
    for (s, _dir) in engines() {
        s.create("/f", file_meta(7), b"", true).unwrap();
        s.write("/f", 0, 10, b"hello", &file_meta(7)).unwrap();
        assert_eq!(s.meta("/f", 0).unwrap().unwrap().size, 15);
        let r = s.read("/f", 0, 7, 0, 100).unwrap().unwrap();
        assert_eq!(&r[..10], &[0u8; 10]);
        assert_eq!(&r[10..], b"hello");
        assert!(matches!(
            s.write("/nope", 0, 0, b"x", &file_meta(1)),
            Err(StoreError::NotFound)
        ));
    }
}

#[test]
fn reads_into_memory_give_what_reads_give() {
    for (s, _dir) in engines() {
        s.create("/r", file_meta(5), b"", true).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
        s.write("/r", 0, 0, &data[..700], &file_meta(5)).unwrap();
        s.write("/r", 2, 24, &data, &file_meta(5)).unwrap();
        // Chunks held, one missing, a stale fileid; offsets from the
        // start to past the end; rooms smaller and larger than the bytes.
        for (idx, fileid) in [(0, 5), (2, 5), (2, 6), (1, 5)] {
            for off in [0u32, 1, 23, 24, 500, 699, 700, 1023, 1024, 5000] {
                for room in [0usize, 1, 100, 1024, 2000] {
                    let want = s.read("/r", idx, fileid, off, room as u32).unwrap();
                    // Memory past the room must stay as it was.
                    let mut mem = vec![0xa5u8; room + 16];
                    let mut buf: Vec<std::mem::MaybeUninit<u8>> =
                        mem.iter().map(|&b| std::mem::MaybeUninit::new(b)).collect();
                    let got = s
                        .read_into(
                            "/r",
                            idx,
                            fileid,
                            off,
                            &mut crate::Dst::from_uninit(&mut buf[..room]),
                        )
                        .unwrap();
                    let at = format!(
                        "{}: chunk {idx} fileid {fileid} off {off} room {room}",
                        s.name()
                    );
                    assert_eq!(got, want.as_ref().map(Vec::len), "{at}");
                    for (m, b) in mem.iter_mut().zip(&buf) {
                        // SAFETY: every byte was initialized above.
                        *m = unsafe { b.assume_init() };
                    }
                    let n = got.unwrap_or(0);
                    if let Some(w) = want {
                        assert_eq!(&mem[..n], &w[..], "{at}");
                    }
                    assert!(
                        mem[n..].iter().all(|&b| b == 0xa5),
                        "{at}: written past the bytes"
                    );
                }
            }
        }
    }
}

#[test]
fn a_chunk_file_cut_short_fails_a_read_into_memory() {
    let d = tempfile::tempdir().unwrap();
    let s = PosixStore::open(d.path(), 0).unwrap();
    s.create("/c", file_meta(5), b"", true).unwrap();
    s.write("/c", 1, 0, &[7u8; 1000], &file_meta(5)).unwrap();
    // The chunk file loses its tail behind the store's back.
    let len = |p: &std::path::PathBuf| std::fs::metadata(p).unwrap().len();
    let data = walk_files(d.path()).into_iter().max_by_key(len).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.set_len(len(&data) - 10).unwrap();
    let mut buf = vec![std::mem::MaybeUninit::new(0u8); 1000];
    assert!(s
        .read_into("/c", 1, 5, 0, &mut crate::Dst::from_uninit(&mut buf))
        .is_err());
    assert!(s.read("/c", 1, 5, 0, 1000).is_err());
}

/// Every file below `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn writes_of_owned_and_fetched_buffers_store_what_copied_writes_store() {
    // (idx, fileid, off, len): fresh chunks at 0 and past a gap, whole and
    // partial overwrites from 0, writes past the end, a stale chunk
    // replaced; on chunk 0 and on data chunks.
    let steps: [(u64, u32, u32, usize); 12] = [
        (0, 5, 0, 300),
        (0, 5, 0, 500),
        (0, 5, 0, 100),
        (0, 5, 200, 50),
        (0, 5, 700, 10),
        (2, 5, 0, 400),
        (2, 5, 0, 1000),
        (2, 5, 0, 10),
        (2, 5, 990, 34),
        (3, 5, 100, 20),
        (2, 6, 0, 64),
        (3, 6, 0, 1024),
    ];
    for (s, _dir) in engines() {
        for p in ["/copied", "/owned", "/fetched"] {
            s.create(p, file_meta(5), b"", true).unwrap();
        }
        let before = s.stats().bytes;
        for (k, &(idx, fileid, off, len)) in steps.iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + k * 31) as u8).collect();
            s.write("/copied", idx, off, &data, &file_meta(fileid))
                .unwrap();
            let b = bytes::Bytes::from(data);
            // Every other step with a second reference (the engine must
            // copy rather than take the buffer).
            let _held = (k % 2 == 1).then(|| b.clone());
            s.write_bytes("/owned", idx, off, b.clone(), &file_meta(fileid))
                .unwrap();
            // Fetched into place (or first into a buffer), every other
            // step while a reader holds a slice of the chunk, which must
            // not change.
            let held = (k % 2 == 0).then(|| {
                let r = s.read_bytes("/fetched", idx, fileid, 0, 1024).unwrap();
                (r.clone(), r.map(|r| r.to_vec()))
            });
            let fetch = |dst: &mut [std::mem::MaybeUninit<u8>]| {
                for (o, v) in dst.iter_mut().zip(b.iter()) {
                    o.write(*v);
                }
                Ok(())
            };
            let src = crate::Src::Fill(crate::Fill::new(b.len(), &fetch));
            s.write_from("/fetched", idx, off, src, &file_meta(fileid))
                .unwrap();
            if let Some((slice, was)) = held {
                assert_eq!(slice.map(|r| r.to_vec()), was, "{}: step {k}", s.name());
            }
            for i in [0, 2, 3] {
                for f in [5, 6] {
                    for p in ["/owned", "/fetched"] {
                        assert_eq!(
                            s.read(p, i, f, 0, 1024).unwrap(),
                            s.read("/copied", i, f, 0, 1024).unwrap(),
                            "{}: {p} chunk {i} (fileid {f}) after step {k}",
                            s.name()
                        );
                    }
                }
            }
            for p in ["/owned", "/fetched"] {
                assert_eq!(
                    s.meta(p, 0).unwrap().unwrap().size,
                    s.meta("/copied", 0).unwrap().unwrap().size
                );
            }
        }
        let all = s.stats().bytes - before;
        s.remove_chunks("/copied", 0).unwrap();
        let two = s.stats().bytes - before;
        assert_eq!(2 * (all - two), two, "{}: bytes in use", s.name());
    }
}

/// A write whose fetch fails fails with the fetch's error and leaves the
/// chunk's length, the entry's size and the bytes in use as they were.
#[test]
fn a_write_whose_fetch_fails_changes_no_length() {
    for (s, _dir) in engines() {
        s.create("/f", file_meta(3), b"", true).unwrap();
        s.write("/f", 0, 0, &[1; 100], &file_meta(3)).unwrap();
        s.write("/f", 2, 0, &[2; 100], &file_meta(3)).unwrap();
        let before = s.stats().bytes;
        let fail = |dst: &mut [std::mem::MaybeUninit<u8>]| {
            dst[0].write(9);
            Err(StoreError::refused(libc::EFAULT, "bad address"))
        };
        // (over the end of a chunk, past it with a gap, a new chunk, a
        // whole chunk)
        for (idx, off, len) in [(0, 50, 200), (2, 300, 10), (3, 0, 500), (4, 0, 1024)] {
            let src = crate::Src::Fill(crate::Fill::new(len, &fail));
            let e = s
                .write_from("/f", idx, off, src, &file_meta(3))
                .unwrap_err();
            assert_eq!(e.errno(), libc::EFAULT, "{}", s.name());
        }
        assert_eq!(s.stats().bytes, before, "{}", s.name());
        assert_eq!(s.meta("/f", 0).unwrap().unwrap().size, 100, "{}", s.name());
        assert_eq!(s.read("/f", 2, 3, 0, 1024).unwrap().unwrap(), vec![2; 100]);
        for idx in [3, 4] {
            assert_eq!(s.read("/f", idx, 3, 0, 1024).unwrap(), None, "{}", s.name());
        }
        // A failed fetch keeps no space: many of them (more than the
        // persistent engines' 8 MiB could hold), then a write that fits.
        for _ in 0..10_000 {
            let src = crate::Src::Fill(crate::Fill::new(1024, &fail));
            assert!(s.write_from("/f", 5, 0, src, &file_meta(3)).is_err());
        }
        s.write("/f", 5, 0, &[5; 1024], &file_meta(3)).unwrap();
    }
}

#[test]
fn shared_reads_equal_copied_reads_and_keep_what_they_saw() {
    for (s, _dir) in engines() {
        let name = s.name();
        s.create("/r", file_meta(5), b"entry", true).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        s.write("/r", 1, 0, &data, &file_meta(5)).unwrap();
        for (idx, f, off, len) in [
            (0, 5, 0, 100),
            (1, 5, 0, 4096),
            (1, 5, 100, 50),
            (1, 5, 4000, 500),
            (1, 6, 0, 10),
            (2, 5, 0, 10),
        ] {
            assert_eq!(
                s.read_bytes("/r", idx, f, off, len).unwrap().map(Vec::from),
                s.read("/r", idx, f, off, len).unwrap(),
                "{name}: chunk {idx} fileid {f} at {off}+{len}"
            );
        }
        // A slice read before writes (in place, past the end, over all of
        // it, truncation) still holds the bytes it read.
        let seen = s.read_bytes("/r", 1, 5, 0, 4096).unwrap().unwrap();
        s.write("/r", 1, 10, b"new", &file_meta(5)).unwrap();
        s.write("/r", 1, 4096, b"more", &file_meta(5)).unwrap();
        let whole = bytes::Bytes::from(vec![9u8; 8192]);
        s.write_bytes("/r", 1, 0, whole, &file_meta(5)).unwrap();
        s.truncate_chunk("/r", 1, 5).unwrap();
        assert_eq!(&seen[..], &data[..], "{name}");
        assert_eq!(
            s.read("/r", 1, 5, 0, 100).unwrap().unwrap(),
            vec![9u8; 5],
            "{name}"
        );
    }
}

#[test]
fn stale_data_chunks_read_as_holes_and_are_replaced() {
    for (s, _dir) in engines() {
        s.write("/f", 3, 0, b"old", &file_meta(1)).unwrap();
        assert_eq!(s.read("/f", 3, 1, 0, 3).unwrap().unwrap(), b"old");
        assert!(s.read("/f", 3, 2, 0, 3).unwrap().is_none());
        s.write("/f", 3, 1, b"n", &file_meta(2)).unwrap();
        assert_eq!(s.read("/f", 3, 2, 0, 3).unwrap().unwrap(), b"\0n");
    }
}

#[test]
fn concurrent_disjoint_writes_to_one_chunk_all_land() {
    for (s, _dir) in engines() {
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..100u32 {
                        let off = (i * 8 + t as u32) * 3;
                        s.write("/c", 1, off, &[t + 1; 3], &file_meta(5)).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let data = s.read("/c", 1, 5, 0, 1 << 20).unwrap().unwrap();
        assert_eq!(data.len(), 2400);
        for (k, b) in data.chunks(3).enumerate() {
            assert_eq!(b, &[(k % 8) as u8 + 1; 3]);
        }
    }
}

/// A large directory (its entries in every shard of the index) listed in
/// pages of several sizes: every name once, in order, each with its own
/// header; entries created and removed between pages show up (after the
/// cursor) or not as they should. The same in the root directory.
#[test]
fn large_directory_listing_pages_with_each_entry_own_header() {
    const N: u32 = 1500;
    for (s, _dir) in engines() {
        for dir in ["/big", "/"] {
            let path = |i: u32| chfs_proto::path::join(dir, &format!("e{i:05}"));
            for i in 0..N {
                // Odd entries are directories, and each file's size says
                // which it is: a header given to the wrong name shows.
                let m = if i % 2 == 1 {
                    Meta {
                        mode: libc::S_IFDIR | 0o755,
                        ..Default::default()
                    }
                } else {
                    Meta {
                        size: i as u64,
                        ..file_meta(i)
                    }
                };
                s.create(&path(i), m, b"", true).unwrap();
            }
            // Data chunks and deeper entries are not listed.
            s.write(&path(2), 1, 0, b"x", &file_meta(2)).unwrap();
            s.create(&format!("{}/inner", path(1)), file_meta(9), b"", true)
                .unwrap();
            let check = |name: &str, m: &Meta| {
                let i: u32 = name[1..].parse().unwrap();
                if i % 2 == 1 {
                    assert!(m.is_dir(), "{name}");
                } else {
                    assert!(m.is_reg(), "{name}");
                    assert_eq!((m.size, m.fileid), (i as u64, i), "{name}");
                }
            };
            for max in [1, 7, 100, 1499, 1500, 4096] {
                let (mut after, mut seen) = (String::new(), Vec::new());
                loop {
                    let (page, done) = s.list_dir(dir, &after, max).unwrap();
                    assert!(page.len() <= max);
                    for (n, m) in &page {
                        check(n, m);
                        seen.push(n.clone());
                    }
                    if done {
                        break;
                    }
                    after = page.last().unwrap().0.clone();
                }
                let want: Vec<String> = (0..N).map(|i| format!("e{i:05}")).collect();
                assert_eq!(seen, want, "max {max}");
            }
            // Changes between pages: after a page ending at e00099, remove
            // e00050 (listed) and e00500 (not yet), add e00099a (after the
            // cursor) and e00000a (before it).
            let (page, done) = s.list_dir(dir, "", 100).unwrap();
            assert!(!done);
            let cursor = page.last().unwrap().0.clone();
            assert_eq!(cursor, "e00099");
            s.remove(&path(50), 0, &mut |_| Ok(())).unwrap();
            s.remove(&path(500), 0, &mut |_| Ok(())).unwrap();
            let added = Meta {
                size: 7,
                ..file_meta(7)
            };
            for n in ["e00099a", "e00000a"] {
                s.create(&chfs_proto::path::join(dir, n), added, b"", true)
                    .unwrap();
            }
            let (mut after, mut rest) = (cursor, Vec::new());
            loop {
                let (page, done) = s.list_dir(dir, &after, 64).unwrap();
                for (n, m) in &page {
                    if n == "e00099a" {
                        assert_eq!(m.size, 7);
                    } else {
                        check(n, m);
                    }
                    rest.push(n.clone());
                }
                if done {
                    break;
                }
                after = page.last().unwrap().0.clone();
            }
            let mut want: Vec<String> = (100..N)
                .filter(|&i| i != 500)
                .map(|i| format!("e{i:05}"))
                .collect();
            want.insert(0, "e00099a".to_string());
            assert_eq!(rest, want);
        }
    }
}

/// Names short enough to be kept inline in the directory index and longer
/// ones, ASCII and not, list in `str` order in pages of one, and are
/// removed by name.
#[test]
fn directory_listing_orders_short_and_long_names_as_str() {
    let mut names: Vec<String> = ["a", "b", "é", "ab", "a-b", "z"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for n in 20..26 {
        names.push("a".repeat(n));
        names.push(format!("{}b", "a".repeat(n)));
        names.push(format!("{}é", "a".repeat(n)));
    }
    for (s, _dir) in engines() {
        for n in &names {
            s.create(&format!("/d/{n}"), file_meta(1), b"", true)
                .unwrap();
        }
        let list = |s: &Arc<dyn Store>| {
            let (mut after, mut seen) = (String::new(), Vec::new());
            loop {
                let (page, done) = s.list_dir("/d", &after, 1).unwrap();
                seen.extend(page.iter().map(|e| e.0.clone()));
                if done {
                    return seen;
                }
                after = page.last().unwrap().0.clone();
            }
        };
        let mut want = names.clone();
        want.sort();
        assert_eq!(list(&s), want);
        for n in ["a".repeat(23), "a".repeat(22), "é".to_string()] {
            s.remove(&format!("/d/{n}"), 0, &mut |_| Ok(())).unwrap();
            want.retain(|w| *w != n);
        }
        assert_eq!(list(&s), want);
    }
}

#[test]
fn directory_listing_pages_in_name_order() {
    for (s, _dir) in engines() {
        for n in ["c", "a", "b", "d"] {
            s.create(&format!("/d/{n}"), file_meta(1), b"", true)
                .unwrap();
        }
        s.write("/d/a", 1, 0, b"x", &file_meta(1)).unwrap();
        s.create("/d/a/deeper", file_meta(1), b"", true).unwrap();
        let (e, done) = s.list_dir("/d", "", 2).unwrap();
        assert_eq!(
            e.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(!done);
        let (e, done) = s.list_dir("/d", "b", 10).unwrap();
        assert_eq!(
            e.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
            ["c", "d"]
        );
        assert!(done);
        assert!(s.has_children("/d").unwrap());
        assert!(!s.has_children("/d/b").unwrap());
        let mut below = s.paths_below("/d").unwrap();
        below.sort();
        assert_eq!(below, ["/d/a", "/d/a/deeper", "/d/b", "/d/c", "/d/d"]);
    }
}

#[test]
fn remove_checks_and_unindexes() {
    for (s, _dir) in engines() {
        s.create("/x", file_meta(1), b"", true).unwrap();
        let e = s
            .remove("/x", 0, &mut |_| {
                Err(StoreError::refused(libc::EISDIR, "is a directory"))
            })
            .unwrap_err();
        assert_eq!(e.errno(), libc::EISDIR);
        s.remove("/x", 0, &mut |_| Ok(())).unwrap();
        assert!(!s.has_children("/").unwrap());
        assert!(s.meta("/x", 0).unwrap().is_none());
        assert!(matches!(
            s.remove("/x", 0, &mut |_| Ok(())),
            Err(StoreError::NotFound)
        ));
    }
}

#[test]
fn remove_and_truncate_chunks() {
    for (s, _dir) in engines() {
        for i in 1..6 {
            s.write("/t", i, 0, &[1; 100], &file_meta(1)).unwrap();
        }
        assert_eq!(s.remove_chunks("/t", 3).unwrap(), 3);
        assert_eq!(s.chunk_indices("/t").unwrap(), [1, 2]);
        s.truncate_chunk("/t", 2, 10).unwrap();
        assert_eq!(s.read("/t", 2, 1, 0, 100).unwrap().unwrap().len(), 10);
        assert_eq!(s.stats().bytes, 110);
        assert_eq!(s.stats().entries, 2);
    }
}

#[test]
fn capacity_is_enforced_and_freed_space_reused() {
    let s = MemStore::new(1000);
    s.write("/a", 1, 0, &[0; 800], &file_meta(1)).unwrap();
    let e = s.write("/b", 1, 0, &[0; 300], &file_meta(1)).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    s.remove_chunks("/a", 0).unwrap();
    s.write("/b", 1, 0, &[0; 300], &file_meta(1)).unwrap();
    assert_eq!(s.stats().bytes, 300);
}

#[test]
fn take_and_put_move_chunks() {
    for (s, _dir) in engines() {
        s.create("/m", file_meta(1), b"abc", true).unwrap();
        let c = s.take("/m", 0).unwrap().unwrap();
        assert_eq!(c.data, &b"abc"[..]);
        assert!(!s.has_children("/").unwrap());
        s.put("/n", 0, c).unwrap();
        assert_eq!(s.list_dir("/", "", 10).unwrap().0[0].0, "n");
    }
}

#[test]
fn directory_versions_count_every_change_of_the_name_set_and_only_those() {
    for (s, _dir) in engines() {
        assert_eq!(s.dir_version("/d"), None, "no entries: absent");
        s.create("/d/a", file_meta(1), b"", true).unwrap();
        let v = s.dir_version("/d").expect("present");
        assert!(v.born > 0);
        assert_eq!(v.changes, 1);
        // Not changes of the set: an existing entry created again, a
        // write to it, its data chunks, another directory.
        assert!(!s.create("/d/a", file_meta(2), b"", false).unwrap().1);
        s.write("/d/a", 0, 0, b"xyz", &file_meta(1)).unwrap();
        s.write("/d/a", 1, 0, b"xyz", &file_meta(1)).unwrap();
        s.remove_chunks("/d/a", 1).unwrap();
        s.create("/e/a", file_meta(3), b"", true).unwrap();
        assert_eq!(s.dir_version("/d"), Some(v));
        // Changes: a name added, a name removed, a name moved in.
        s.create("/d/b", file_meta(4), b"", true).unwrap();
        s.remove("/d/a", 0, &mut |_| Ok(())).unwrap();
        let c = s.take("/e/a", 0).unwrap().unwrap();
        s.put("/d/c", 0, c).unwrap();
        let w = s.dir_version("/d").unwrap();
        assert_eq!((w.born, w.changes), (v.born, 4));
        // A failed removal changes nothing.
        assert!(s.remove("/d/zz", 0, &mut |_| Ok(())).is_err());
        assert_eq!(s.dir_version("/d"), Some(w));
        // Emptied: absent; a new first entry starts a new life, never
        // with a number given before (so absent -> present -> absent ->
        // present is never mistaken for no change).
        s.remove("/d/b", 0, &mut |_| Ok(())).unwrap();
        s.remove_chunks("/d/c", 0).unwrap();
        assert_eq!(s.dir_version("/d"), None);
        s.create("/d/b", file_meta(5), b"", true).unwrap();
        let x = s.dir_version("/d").unwrap();
        assert_ne!(x.born, v.born);
        assert_eq!(x.changes, 1);
    }
}

#[test]
fn directory_versions_of_a_reopened_store_are_born_again() {
    let d = tempfile::tempdir().unwrap();
    let before = {
        let s = PosixStore::open(d.path(), 0).unwrap();
        s.create("/d/a", file_meta(1), b"", true).unwrap();
        s.dir_version("/d").unwrap()
    };
    let s = PosixStore::open(d.path(), 0).unwrap();
    let after = s.dir_version("/d").expect("rebuilt at open");
    assert!(after.born > before.born, "{after:?} after {before:?}");
}

/// Creates and removes of the same paths racing on several threads leave
/// the directory's names and its entries in agreement: every name listed
/// has its entry and every entry is listed. With the name index updated
/// after the shard's lock was let go, a remove racing a create could drop
/// the name of an entry that exists (readdir never listed that file) or
/// keep the name of one removed. (The window was a few instructions: this
/// test did not hit it in 200 rounds of 4 x 20,000 operations on 2 CPUs;
/// it guards the invariant, the lock order in index.rs closes the window.)
#[test]
fn racing_creates_and_removes_keep_names_and_entries_together() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new(0));
    let names: Vec<String> = (0..4).map(|i| format!("/d/f{i}")).collect();
    for _round in 0..20 {
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (s, names) = (&s, &names);
                sc.spawn(move || {
                    for i in 0..2000u64 {
                        let p = &names[((i + t) % 4) as usize];
                        if (i + t) % 2 == 0 {
                            let _ = s.create(p, file_meta(i as u32 + 1), b"", false);
                        } else {
                            let _ = s.remove(p, 0, &mut |_| Ok(()));
                        }
                    }
                });
            }
        });
        let listed: std::collections::BTreeSet<String> = s
            .list_dir("/d", "", 100)
            .unwrap()
            .0
            .into_iter()
            .map(|(n, _)| format!("/d/{n}"))
            .collect();
        let present: std::collections::BTreeSet<String> = names
            .iter()
            .filter(|p| s.meta(p, 0).unwrap().is_some())
            .cloned()
            .collect();
        assert_eq!(listed, present, "names listed vs entries present");
    }
}
