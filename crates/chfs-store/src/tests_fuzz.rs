//! Bounded fuzzing of everything that parses bytes read from a medium:
//! the raw decoders (header slot, pmem superblock and extent word, POSIX
//! superblock and chunk file) on arbitrary bytes, and whole-store recovery
//! from valid images with random damage (bit flips, byte runs, header
//! fields changed *with* their checksums fixed, so that the checks behind
//! the checksums are reached too, truncation, extension, and for the POSIX
//! engine removed, renamed and foreign files).
//!
//! Every case runs on a watchdog thread: it must finish within
//! [`CASE_LIMIT`] (no hang) and ask the allocator for at most
//! [`MAX_ALLOC`] bytes at once (no absurd allocation from a length read off
//! the medium; the test binary's allocator notes the largest request of a
//! watched thread, and refuses one above [`REFUSE_ALLOC`] so that such a bug
//! aborts the run instead of exhausting the machine's memory). A store that
//! opens must answer every read and listing with
//! data or an error, must store and read back new data (or refuse cleanly),
//! and must open again afterwards.
//!
//! Case counts are sized for a few seconds per test on slow cores; set
//! `CHFS_FUZZ_CASES` for longer runs (the store-level tests run that many
//! cases, the raw decoders ten times as many). Failures found here are kept
//! as named regression tests at the end of this file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use chfs_proto::Meta;
use proptest::prelude::*;
use proptest::test_runner::Config as PtConfig;

use crate::crc::crc32c;
use crate::pmem::{
    decode_super, encode_super, inspect_pmem, unword, word, DATA_START, FREE,
    PATH_OFF as PMEM_PATH_OFF, PMEM_VERSION, SLOT0, UNIT, USED,
};
use crate::posix::{
    chunk_file, read_chunk_file, read_posix_super, slot_off, DATA_OFF, PATH_OFF as POSIX_PATH_OFF,
    POSIX_MAGIC, POSIX_SUPER, POSIX_VERSION,
};
use crate::record::{Slot, MAX_SEQ, SLOT_LEN};
use crate::tests::shm_dir;
use crate::{PmemStore, PosixStore, Store};

// ---------------------------------------------------------------------------
// Watchdog: time and allocation bounds of one case.

/// Longest a case may take (generous: slow cores, parallel tests).
const CASE_LIMIT: Duration = Duration::from_secs(30);
/// Largest single allocation a case may make.
const MAX_ALLOC: usize = 16 << 20;

/// The system allocator, noting the largest request made by a thread that
/// asked to be watched (the cases below; other tests are not watched).
struct Watching;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Requests above this fail outright on a watched thread (the process
/// then aborts with "memory allocation of N bytes failed") rather than
/// taking the machine's memory: a test must not be ended by the OOM killer.
const REFUSE_ALLOC: usize = 1 << 30;

/// Notes a request of `size` bytes; false when it is to be refused.
fn note(size: usize) -> bool {
    // try_with: never fails on a live thread; during thread teardown it
    // may, and then there is nothing to note.
    WATCHED
        .try_with(|w| {
            if w.get() {
                let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
            }
            !w.get() || size <= REFUSE_ALLOC
        })
        .unwrap_or(true)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, or fails (null) as an allocator may; `note` only touches
// const-initialised thread-locals (no allocation, no unwinding).
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Watching = Watching;

/// Runs `f` on a watched thread; panics (with `what`) when it panics, runs
/// longer than [`CASE_LIMIT`] or makes an allocation above [`MAX_ALLOC`].
fn bounded<T: Send + 'static>(what: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel::<()>();
    let h = std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            WATCHED.with(|w| w.set(true));
            LARGEST.with(|l| l.set(0));
            let r = f();
            let largest = LARGEST.with(Cell::get);
            WATCHED.with(|w| w.set(false));
            let _ = tx.send(());
            (r, largest)
        })
        .expect("spawn case thread");
    match rx.recv_timeout(CASE_LIMIT) {
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // The case's thread cannot be stopped, and shrinking would
            // start more of them: report the input and end the run.
            // (Straight to stderr: the test harness's capture of eprintln
            // would be lost with the process.)
            let _ = writeln!(
                std::io::stderr(),
                "FUZZ HANG: {what}: no result after {CASE_LIMIT:?}"
            );
            std::process::abort();
        }
        // Sent, or the thread ended without sending (it panicked).
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok((r, largest)) => {
                assert!(
                    largest <= MAX_ALLOC,
                    "{what}: one allocation of {largest} bytes"
                );
                r
            }
            Err(p) => std::panic::resume_unwind(p),
        },
    }
}

/// Cases of a test: `default`, or `CHFS_FUZZ_CASES` times `scale` (1 for
/// the store-level tests, 10 for the raw decoders, whose cases are cheap).
fn cases(default: u32, scale: u32) -> u32 {
    std::env::var("CHFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(default, |n| n.saturating_mul(scale))
}

fn config(cases: u32) -> PtConfig {
    PtConfig {
        cases,
        // Failures become named regression tests below, not files.
        failure_persistence: None,
        max_shrink_iters: 256,
        ..PtConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Helpers shared by the cases.

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

/// Rewrites the checksum of an encoded slot.
fn fix_slot_crc(b: &mut [u8]) {
    let c = crc32c(&b[..124]);
    b[124..128].copy_from_slice(&c.to_le_bytes());
}

/// Values that tend to break length and offset arithmetic.
fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        1 => 0..9000u64,
        1 => prop::sample::select(vec![
            0,
            1,
            63,
            64,
            4095,
            4096,
            8192,
            1 << 31,
            u32::MAX as u64 - 1,
            u32::MAX as u64,
            1 << 32,
            1 << 40,
            (1 << 40) - 64,
            i64::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ]),
    ]
}

/// Paths a damaged (or hostile) header may carry.
fn odd_path() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::sample::select(vec![
            "", "/", "a", "é", "//", "/d/", "/d/../x", "/d//x", "/a\0b", "/d/x", "/a", "ü/x",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..40),
        1 => "[/a-zé.]{0,30}".prop_map(String::into_bytes),
    ]
}

/// Field `field` (0..=8) of an encoded slot set to `v`; the checksum is
/// fixed unless the checksum itself is the field.
fn set_slot_field(b: &mut [u8], field: u8, v: u64) {
    match field % 9 {
        0 => b[0..8].copy_from_slice(&v.to_le_bytes()),
        1 => b[8..16].copy_from_slice(&v.to_le_bytes()),
        2 => b[16..24].copy_from_slice(&v.to_le_bytes()),
        3 => b[24..28].copy_from_slice(&(v as u32).to_le_bytes()),
        4 => b[28..32].copy_from_slice(&(v as u32).to_le_bytes()),
        5 => b[32..36].copy_from_slice(&(v as u32).to_le_bytes()),
        6 => b[36..40].copy_from_slice(&(v as u32).to_le_bytes()),
        // A word of the header (version, mode, size, chunk_size, ...).
        7 => {
            let o = 40 + (v as usize % 8) * 8;
            b[o..o + 8].copy_from_slice(&v.rotate_left(17).to_le_bytes());
        }
        _ => {
            b[124..128].copy_from_slice(&(v as u32).to_le_bytes());
            return;
        }
    }
    fix_slot_crc(b);
}

fn file_meta(fid: u32) -> Meta {
    Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 4096,
        fileid: fid,
        mtime: 7,
        ..Default::default()
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Keys a base store holds: (path, chunk, fileid).
type Keys = Vec<(String, u64, u32)>;

/// Fills a store with a little of everything: several files and chunks,
/// a directory, a symlink, a non-ASCII name, copy-on-write overwrites and
/// removals (free extents between records), appends and header changes
/// (both slots in use).
fn populate(s: &dyn Store) -> Keys {
    let dir = Meta {
        mode: libc::S_IFDIR | 0o755,
        ..file_meta(0)
    };
    s.create("/a", file_meta(1), b"hello", true).unwrap();
    s.write("/a", 0, 5, b" world", &file_meta(1)).unwrap();
    s.create("/d", dir, b"", true).unwrap();
    s.create("/d/x", file_meta(2), b"", true).unwrap();
    s.write("/d/x", 1, 0, &pattern(1, 700), &file_meta(2))
        .unwrap();
    s.write("/d/x", 2, 0, &pattern(2, 1500), &file_meta(2))
        .unwrap();
    s.write("/d/x", 3, 0, &pattern(3, 64), &file_meta(2))
        .unwrap();
    s.write("/d/x", 1, 100, b"overwritten", &file_meta(2))
        .unwrap();
    s.create("/d/gone", file_meta(9), &pattern(9, 300), true)
        .unwrap();
    s.remove("/d/gone", 0, &mut |_| Ok(())).unwrap();
    s.update_meta("/a", 0, &mut |m| {
        m.mode = libc::S_IFREG | 0o600;
        Ok(())
    })
    .unwrap();
    s.truncate_chunk("/d/x", 3, 10).unwrap();
    s.create("/d/é-ü", file_meta(4), "ünïcödé".as_bytes(), true)
        .unwrap();
    let link = Meta {
        mode: libc::S_IFLNK | 0o777,
        ..file_meta(5)
    };
    s.create("/d/l", link, b"/a", true).unwrap();
    s.sync().unwrap();
    vec![
        ("/a".into(), 0, 1),
        ("/d".into(), 0, 0),
        ("/d/x".into(), 0, 2),
        ("/d/x".into(), 1, 2),
        ("/d/x".into(), 2, 2),
        ("/d/x".into(), 3, 2),
        ("/d/é-ü".into(), 0, 4),
        ("/d/l".into(), 0, 5),
        ("/d/gone".into(), 0, 9),
    ]
}

/// Uses a store that opened from a damaged image: every read and listing
/// answers with data or an error; new data is stored and read back (or
/// refused with an error). Returns what was written and read back (path,
/// chunk, fileid, offset, bytes), to be checked after a reopen.
fn exercise(s: &dyn Store, keys: &Keys) -> Vec<(String, u64, u32, u32, Vec<u8>)> {
    const MAX_READ: u32 = 1 << 20;
    let _ = s.stats();
    let mut paths: Vec<String> = keys.iter().map(|k| k.0.clone()).collect();
    if let Ok(below) = s.paths_below("/") {
        paths.extend(below);
    }
    paths.sort();
    paths.dedup();
    for p in &paths {
        let idxs = s.chunk_indices(p).unwrap_or_default();
        for idx in idxs.iter().copied().chain(0..4) {
            let fid = match s.meta(p, idx) {
                Ok(Some(m)) => m.fileid,
                _ => keys.iter().find(|k| &k.0 == p).map_or(0, |k| k.2),
            };
            for (off, len) in [(0, MAX_READ), (5, 3), (u32::MAX, u32::MAX)] {
                if let Ok(Some(v)) = s.read(p, idx, fid, off, len) {
                    assert!(v.len() as u64 <= len as u64, "{p} {idx}: long read");
                }
            }
            let _ = s.read_bytes(p, idx, fid, 1, 100);
        }
        let _ = s.has_children(p);
        // A listing pages forward and ends.
        let mut after = String::new();
        for _ in 0..64 {
            let Ok((page, done)) = s.list_dir(p, &after, 2) else {
                break;
            };
            for (name, _) in &page {
                assert!(*name > after, "listing of {p} does not advance");
                after = name.clone();
            }
            if done || page.is_empty() {
                break;
            }
        }
    }
    let mut wrote = Vec::new();
    let mut check = |s: &dyn Store, p: &str, idx: u64, fid: u32, off: u32, data: Vec<u8>| {
        let got = s.read(p, idx, fid, off, data.len() as u32);
        match got {
            Ok(Some(v)) if v == data => wrote.push((p.to_string(), idx, fid, off, data)),
            other => panic!(
                "{p} chunk {idx}: wrote {} bytes at {off}, read back {:?}",
                data.len(),
                other.map(|o| o.map(|v| v.len()))
            ),
        }
    };
    // A new file.
    if s.create("/fuzz", file_meta(77), b"new", true).is_ok() {
        check(s, "/fuzz", 0, 77, 0, b"new".to_vec());
        let data = pattern(77, 3000);
        if s.write("/fuzz", 1, 0, &data, &file_meta(77)).is_ok() {
            check(s, "/fuzz", 1, 77, 0, data);
        }
    }
    // Writes into recovered records: in place, appended, copied on write.
    for (p, idx, fid) in [("/d/x", 1, 2), ("/a", 0, 1), ("/d/x", 2, 2)] {
        let data = pattern(idx as u8, 40);
        if s.write(p, idx, 5, &data, &file_meta(fid)).is_ok() {
            check(s, p, idx, fid, 5, data);
        }
        let data = pattern(9, 2000);
        if s.write(p, idx, 1800, &data, &file_meta(fid)).is_ok() {
            check(s, p, idx, fid, 1800, data);
        }
    }
    let _ = s.update_meta("/d/l", 0, &mut |m| {
        m.uid = 5;
        Ok(())
    });
    let _ = s.truncate_chunk("/d/x", 2, 100);
    let _ = s.remove_chunks("/d/x", 3);
    let _ = s.take("/d/é-ü", 0);
    let _ = s.sync();
    wrote
}

/// After a reopen, what [`exercise`] wrote (and nothing changed since)
/// reads back: the last write of each chunk, unless [`exercise`] cut or
/// removed it afterwards.
fn check_reopened(s: &dyn Store, wrote: &[(String, u64, u32, u32, Vec<u8>)], what: &str) {
    let trimmed = [("/d/x", 2, 100u32), ("/d/x", 3, 0), ("/d/é-ü", 0, 0)];
    for (i, (p, idx, fid, off, data)) in wrote.iter().enumerate() {
        let later = wrote[i + 1..].iter().any(|w| w.0 == *p && w.1 == *idx);
        let cut = trimmed
            .iter()
            .any(|t| t.0 == p && t.1 == *idx && (off + data.len() as u32) > t.2);
        if later || cut {
            continue;
        }
        let got = s.read(p, *idx, *fid, *off, data.len() as u32);
        assert!(
            matches!(&got, Ok(Some(v)) if v == data),
            "{what}: {p} chunk {idx} at {off}: read {:?} after reopen",
            got.map(|o| o.map(|v| v.len()))
        );
    }
}

// ---------------------------------------------------------------------------
// Raw decoders on arbitrary bytes.

fn slot_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Anything.
        prop::collection::vec(any::<u8>(), SLOT_LEN),
        // Anything behind a good checksum (and a good header version half
        // of the time), to reach the checks after the checksum.
        (prop::collection::vec(any::<u8>(), SLOT_LEN), any::<bool>()).prop_map(|(mut b, v1)| {
            if v1 {
                b[40..42].copy_from_slice(&1u16.to_le_bytes());
            }
            fix_slot_crc(&mut b);
            b
        }),
    ]
}

#[test]
fn fuzz_slot_decode() {
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(4000, 10)));
    runner
        .run(&slot_bytes(), |b| {
            let arr: [u8; SLOT_LEN] = b.clone().try_into().expect("slot length");
            bounded("slot".into(), move || {
                let crc_ok = crc32c(&arr[..124]) == u32_at(&arr, 124);
                match Slot::decode(&arr) {
                    Some(s) => {
                        assert!(crc_ok);
                        // Everything the decoder read survives re-encoding
                        // (bytes 104..124 are reserved).
                        assert_eq!(s.encode()[..104], arr[..104]);
                    }
                    None => assert!(
                        !crc_ok
                            || u16::from_le_bytes([arr[40], arr[41]]) != 1
                            || u64::from_le_bytes(arr[..8].try_into().unwrap()) > MAX_SEQ
                    ),
                }
            });
            Ok(())
        })
        .unwrap();
}

fn super_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 64),
        any::<bool>(),
        any::<bool>(),
        edgy_u64(),
    )
        .prop_map(|(mut b, magic, crc, size)| {
            if magic {
                b[0..8].copy_from_slice(crate::pmem::PMEM_MAGIC);
                b[8..12].copy_from_slice(&PMEM_VERSION.to_le_bytes());
                b[12..16].copy_from_slice(&(UNIT as u32).to_le_bytes());
                b[16..24].copy_from_slice(&size.to_le_bytes());
                b[32..40].copy_from_slice(&DATA_START.to_le_bytes());
            }
            if crc {
                let c = crc32c(&b[..40]);
                b[40..44].copy_from_slice(&c.to_le_bytes());
            }
            b
        })
}

#[test]
fn fuzz_pmem_superblock_and_extent_word_decode() {
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(4000, 10)));
    runner
        .run(&(super_bytes(), edgy_u64()), |(b, w)| {
            bounded("pmem superblock".into(), move || {
                let arr: [u8; 64] = b.try_into().expect("64 bytes");
                if let Ok(sb) = decode_super(&arr) {
                    assert_eq!(sb.version, PMEM_VERSION);
                    assert_eq!(encode_super(&sb)[..44], arr[..44]);
                }
                if let Some((state, len)) = unword(w) {
                    assert!(state == FREE || state == USED);
                    assert_eq!(word(state, len), w);
                }
            });
            Ok(())
        })
        .unwrap();
}

#[test]
fn fuzz_posix_superblock_decode() {
    let strat = (
        prop::collection::vec(any::<u8>(), 0..200),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(mut b, magic, crc)| {
            if b.len() >= 44 {
                if magic {
                    b[0..8].copy_from_slice(POSIX_MAGIC);
                    b[8..12].copy_from_slice(&POSIX_VERSION.to_le_bytes());
                }
                if crc {
                    let c = crc32c(&b[..40]);
                    b[40..44].copy_from_slice(&c.to_le_bytes());
                }
            }
            b
        });
    let dir = shm_dir();
    let root = dir.path().to_path_buf();
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(1500, 10)));
    runner
        .run(&strat, |b| {
            let root = root.clone();
            bounded("posix superblock".into(), move || {
                std::fs::write(root.join(POSIX_SUPER), &b).unwrap();
                if let Ok(uuid) = read_posix_super(&root) {
                    assert_eq!(&b[0..8], POSIX_MAGIC);
                    assert_eq!(uuid.to_le_bytes(), b[16..24]);
                }
            });
            Ok(())
        })
        .unwrap();
}

/// A chunk file: two slots (valid ones with hostile fields, or junk), a
/// path, data, and a length that may cut any of them.
#[derive(Debug, Clone)]
struct ChunkFileCase {
    slots: [(bool, u8, u64, Vec<u8>); 2],
    path: Vec<u8>,
    data_len: usize,
    cut: Option<u64>,
    extend: Option<u64>,
}

fn chunk_file_case() -> impl Strategy<Value = ChunkFileCase> {
    let slot = || {
        (
            any::<bool>(),
            0..9u8,
            edgy_u64(),
            prop::collection::vec(any::<u8>(), SLOT_LEN),
        )
    };
    (
        [slot(), slot()],
        odd_path(),
        0..20_000usize,
        prop::option::of(0..30_000u64),
        // A header whose length fits the file has all of it checksummed
        // (by design: a chunk of N bytes is read whole at open), so the
        // extensions stay small enough for that to be quick.
        prop::option::of(prop::sample::select(vec![1u64, 4096, 1 << 20])),
    )
        .prop_map(|(slots, path, data_len, cut, extend)| ChunkFileCase {
            slots,
            path,
            data_len,
            cut,
            extend,
        })
}

const UUID: u64 = 0x1234_5678_9abc_def1;

fn valid_slot(seq: u64, path: &[u8], data: &[u8]) -> [u8; SLOT_LEN] {
    Slot {
        seq,
        uuid: UUID,
        idx: 1,
        data_len: data.len() as u32,
        data_crc: crc32c(data),
        path_len: path.len() as u32,
        path_crc: crc32c(path),
        meta: file_meta(3),
    }
    .encode()
}

#[test]
fn fuzz_posix_chunk_file_decode() {
    let dir = shm_dir();
    let root = dir.path().to_path_buf();
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(1500, 10)));
    runner
        .run(&chunk_file_case(), |c| {
            let root = root.clone();
            bounded(format!("chunk file {c:?}"), move || {
                let data = pattern(7, c.data_len);
                let mut img = vec![0u8; DATA_OFF as usize + data.len()];
                for (n, (valid, field, v, junk)) in c.slots.iter().enumerate() {
                    let b = if *valid {
                        let mut b = valid_slot(n as u64 + 5, &c.path, &data);
                        set_slot_field(&mut b, *field, *v);
                        b.to_vec()
                    } else {
                        junk.clone()
                    };
                    let o = slot_off(n as u8) as usize;
                    img[o..o + SLOT_LEN].copy_from_slice(&b);
                }
                let po = POSIX_PATH_OFF as usize;
                let plen = c.path.len().min(DATA_OFF as usize - po);
                img[po..po + plen].copy_from_slice(&c.path[..plen]);
                img[DATA_OFF as usize..].copy_from_slice(&data);
                if let Some(cut) = c.cut {
                    img.truncate(cut as usize);
                }
                let p = root.join("chunk");
                std::fs::write(&p, &img).unwrap();
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&p)
                    .unwrap();
                if let Some(e) = c.extend {
                    f.set_len(img.len() as u64 + e).unwrap();
                }
                let Ok(cf) = read_chunk_file(&f, UUID) else {
                    return;
                };
                for (_, s) in &cf.slots {
                    assert_eq!(s.uuid, UUID);
                    assert!(s.path_len as usize <= chfs_proto::path::MAX_PATH);
                }
                // The file's bytes (an extension reads as zeros).
                let bytes = |from: usize, n: usize| -> Vec<u8> {
                    (from..from + n)
                        .map(|i| img.get(i).copied().unwrap_or(0))
                        .collect()
                };
                if let Some(path) = &cf.path {
                    assert_eq!(path.as_bytes(), bytes(po, path.len()));
                }
                if let Some(g) = cf.good_slot {
                    let (_, s) = cf.slots.iter().find(|(n, _)| *n == g).unwrap();
                    let n = s.data_len as usize;
                    assert!(DATA_OFF + n as u64 <= cf.file_len.max(DATA_OFF));
                    assert_eq!(crc32c(&bytes(DATA_OFF as usize, n)), s.data_crc);
                }
            });
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------------------
// pmem: recovery from damaged images.

/// Size of the small base image (one arena).
const PMEM_SMALL: u64 = 128 << 10;
/// Size of the large base image: two free-space arenas (whose boundary
/// splits free extents at open), kept as a sparse file.
const PMEM_LARGE: u64 = (130 << 20) + (64 << 10);

struct PmemBase {
    size: u64,
    /// Non-zero 4 KiB pages of the image: (offset, bytes).
    pages: Vec<(u64, Vec<u8>)>,
    keys: Keys,
    /// Extents: (offset, length, used).
    extents: Vec<(u64, u64, bool)>,
    /// (offset, path length) of the used extents.
    path_lens: Vec<(u64, u64)>,
}

fn make_pmem_base(size: u64) -> PmemBase {
    let d = shm_dir();
    let f = d.path().join("base.pmem");
    let s = PmemStore::open(&f, size).unwrap();
    let keys = populate(&s);
    drop(s);
    let ins = inspect_pmem(&f).unwrap();
    assert!(ins.broken_at.is_none());
    let extents: Vec<_> = ins
        .extents
        .iter()
        .map(|e| (e.offset, e.len, e.used))
        .collect();
    let path_lens = ins
        .extents
        .iter()
        .filter_map(|e| Some((e.offset, e.slots.first()?.1.path_len as u64)))
        .collect();
    assert!(extents.iter().filter(|e| e.2).count() >= 8);
    assert!(extents.iter().filter(|e| !e.2).count() >= 2);
    let file = std::fs::File::open(&f).unwrap();
    let mut pages = Vec::new();
    let mut page = vec![0u8; 4096];
    for off in (0..size).step_by(4096) {
        file.read_exact_at(&mut page, off).unwrap();
        if page.iter().any(|&b| b != 0) {
            pages.push((off, page.clone()));
        }
    }
    PmemBase {
        size,
        pages,
        keys,
        extents,
        path_lens,
    }
}

fn pmem_base(large: bool) -> &'static PmemBase {
    static SMALL: OnceLock<PmemBase> = OnceLock::new();
    static LARGE: OnceLock<PmemBase> = OnceLock::new();
    if large {
        let b = LARGE.get_or_init(|| make_pmem_base(PMEM_LARGE));
        // Free extents on both sides of the arenas' boundary.
        assert!(b.extents.last().unwrap().0 > DATA_START + (64 << 20));
        b
    } else {
        SMALL.get_or_init(|| make_pmem_base(PMEM_SMALL))
    }
}

/// Where in an image a mutation lands.
#[derive(Debug, Clone, Copy)]
enum Region {
    Super,
    ExtentWord,
    Slot,
    Path,
    Data,
    Anywhere,
}

fn region() -> impl Strategy<Value = Region> {
    prop_oneof![
        2 => Just(Region::Super),
        3 => Just(Region::ExtentWord),
        4 => Just(Region::Slot),
        1 => Just(Region::Path),
        1 => Just(Region::Data),
        1 => Just(Region::Anywhere),
    ]
}

#[derive(Debug, Clone)]
enum PmemMut {
    /// Flip one bit.
    Flip(Region, u64, u8),
    /// Overwrite a run of bytes.
    Splice(Region, u64, Vec<u8>),
    /// Set a field of a header slot of a record, fixing its checksum.
    SlotField {
        rec: u64,
        slot: u8,
        field: u8,
        value: u64,
    },
    /// Give a record another path (length and checksum fixed in its
    /// slots).
    Path { rec: u64, path: Vec<u8> },
    /// Replace an extent word: a well-formed one with any state and
    /// length, or any 64 bits.
    Word {
        ext: u64,
        state: u64,
        len: u64,
        raw: Option<u64>,
    },
    /// Set a superblock field (fixing its checksum).
    SuperField { field: u8, value: u64 },
    /// Cut the file.
    Truncate(u64),
    /// Grow the file.
    Extend(u64),
}

fn pmem_mut() -> impl Strategy<Value = PmemMut> {
    prop_oneof![
        4 => (region(), any::<u64>(), 0..8u8).prop_map(|(r, at, bit)| PmemMut::Flip(r, at, bit)),
        1 => (region(), any::<u64>(), prop::collection::vec(any::<u8>(), 1..24))
            .prop_map(|(r, at, b)| PmemMut::Splice(r, at, b)),
        4 => (any::<u64>(), 0..2u8, 0..9u8, edgy_u64())
            .prop_map(|(rec, slot, field, value)| PmemMut::SlotField { rec, slot, field, value }),
        1 => (any::<u64>(), odd_path()).prop_map(|(rec, path)| PmemMut::Path { rec, path }),
        3 => (any::<u64>(), 0..4u64, edgy_u64(), prop::option::of(any::<u64>()))
            .prop_map(|(ext, state, len, raw)| PmemMut::Word { ext, state, len, raw }),
        1 => (0..5u8, edgy_u64()).prop_map(|(field, value)| PmemMut::SuperField { field, value }),
        1 => edgy_u64().prop_map(PmemMut::Truncate),
        1 => prop::sample::select(vec![1u64, 8, 64, 4096, 1 << 20, 1 << 32]).prop_map(PmemMut::Extend),
    ]
}

fn pick<T: Copy>(v: &[T], sel: u64) -> T {
    v[(sel % v.len() as u64) as usize]
}

/// An offset within `region` of the base image.
fn locate(base: &PmemBase, r: Region, at: u64) -> u64 {
    let used: Vec<_> = base.extents.iter().filter(|e| e.2).copied().collect();
    match r {
        Region::Super => at % 64,
        Region::ExtentWord => pick(&base.extents, at).0 + (at >> 32) % 8,
        Region::Slot => pick(&used, at).0 + SLOT0 + (at >> 32) % (2 * SLOT_LEN as u64),
        Region::Path => {
            let (o, plen) = pick(&base.path_lens, at);
            o + PMEM_PATH_OFF + (at >> 32) % plen.max(1)
        }
        Region::Data => {
            let (o, len, _) = pick(&used, at);
            o + (at >> 32) % len
        }
        Region::Anywhere => at % base.size,
    }
}

/// `n` bytes of `f` at `off`, if the file has them all.
fn read_file_at(f: &std::fs::File, off: u64, n: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, off).ok()?;
    Some(b)
}

/// Writes what of `data` falls within the file's current length.
fn write_file_within(f: &std::fs::File, off: u64, data: &[u8]) {
    let len = f.metadata().unwrap().len();
    if off < len {
        let n = data.len().min((len - off) as usize);
        f.write_all_at(&data[..n], off).unwrap();
    }
}

/// Lays out the base image in `f` (sparse) and damages it.
fn mutate_pmem(base: &PmemBase, f: &std::fs::File, muts: &[PmemMut]) {
    f.set_len(base.size).unwrap();
    for (off, page) in &base.pages {
        f.write_all_at(page, *off).unwrap();
    }
    let used: Vec<_> = base.extents.iter().filter(|e| e.2).copied().collect();
    let slot_at = |rec: u64, n: u64| pick(&used, rec).0 + SLOT0 + n * SLOT_LEN as u64;
    for m in muts {
        match m {
            PmemMut::Flip(r, at, bit) => {
                let o = locate(base, *r, *at);
                if let Some(mut b) = read_file_at(f, o, 1) {
                    b[0] ^= 1 << bit;
                    f.write_all_at(&b, o).unwrap();
                }
            }
            PmemMut::Splice(r, at, b) => write_file_within(f, locate(base, *r, *at), b),
            PmemMut::SlotField {
                rec,
                slot,
                field,
                value,
            } => {
                let o = slot_at(*rec, *slot as u64);
                if let Some(mut b) = read_file_at(f, o, SLOT_LEN) {
                    set_slot_field(&mut b, *field, *value);
                    f.write_all_at(&b, o).unwrap();
                }
            }
            PmemMut::Path { rec, path } => {
                write_file_within(f, pick(&used, *rec).0 + PMEM_PATH_OFF, path);
                for n in 0..2 {
                    let o = slot_at(*rec, n);
                    if let Some(mut b) = read_file_at(f, o, SLOT_LEN) {
                        b[32..36].copy_from_slice(&(path.len() as u32).to_le_bytes());
                        b[36..40].copy_from_slice(&crc32c(path).to_le_bytes());
                        fix_slot_crc(&mut b);
                        f.write_all_at(&b, o).unwrap();
                    }
                }
            }
            PmemMut::Word {
                ext,
                state,
                len,
                raw,
            } => {
                let w = raw.unwrap_or_else(|| word(*state, *len));
                write_file_within(f, pick(&base.extents, *ext).0, &w.to_le_bytes());
            }
            PmemMut::SuperField { field, value } => {
                if let Some(mut b) = read_file_at(f, 0, 64) {
                    let o = [8usize, 12, 16, 24, 32][*field as usize % 5];
                    let w = if o == 8 || o == 12 { 4 } else { 8 };
                    b[o..o + w].copy_from_slice(&value.to_le_bytes()[..w]);
                    let c = crc32c(&b[..40]);
                    b[40..44].copy_from_slice(&c.to_le_bytes());
                    f.write_all_at(&b, 0).unwrap();
                }
            }
            PmemMut::Truncate(at) => {
                let len = f.metadata().unwrap().len();
                f.set_len(at % (len + 1)).unwrap();
            }
            PmemMut::Extend(by) => {
                let len = f.metadata().unwrap().len();
                f.set_len(len + by).unwrap();
            }
        }
    }
}

/// Opens a damaged pmem image: an error or a store that works. Returns
/// whether it opened.
fn pmem_case(large: bool, muts: Vec<PmemMut>) -> bool {
    let what = format!("pmem (large: {large}) {muts:?}");
    bounded(what.clone(), move || {
        let base = pmem_base(large);
        let d = shm_dir();
        let path = d.path().join("case.pmem");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        mutate_pmem(base, &f, &muts);
        drop(f);
        // The dump tool's decoder reads any image without panicking.
        let _ = inspect_pmem(&path);
        let Ok(s) = PmemStore::open(&path, 0) else {
            return false;
        };
        let wrote = exercise(&s, &base.keys);
        drop(s);
        let s = PmemStore::open(&path, 0)
            .unwrap_or_else(|e| panic!("{what}: opened once, then not: {e}"));
        check_reopened(&s, &wrote, &what);
        let _ = exercise(&s, &base.keys);
        true
    })
}

/// Counts the cases that opened a store and those that did not, and
/// checks that both happen (the damage is neither always fatal nor always
/// harmless, or the test would prove little).
#[derive(Default)]
struct Outcomes {
    opened: std::sync::atomic::AtomicU32,
    refused: std::sync::atomic::AtomicU32,
}

impl Outcomes {
    fn add(&self, opened: bool) {
        let c = if opened { &self.opened } else { &self.refused };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn check(&self, what: &str) {
        let o = self.opened.load(std::sync::atomic::Ordering::Relaxed);
        let r = self.refused.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("{what}: {o} damaged stores opened, {r} refused");
        if o + r >= 100 {
            assert!(
                o * 10 >= o + r && r * 30 >= o + r,
                "{what}: {o} opened, {r} refused"
            );
        }
    }
}

#[test]
fn fuzz_pmem_recovery_from_damaged_images() {
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(4000, 1)));
    let seen = Outcomes::default();
    let strat = (
        prop::bool::weighted(0.2),
        prop::collection::vec(pmem_mut(), 1..4),
    );
    runner
        .run(&strat, |(large, muts)| {
            seen.add(pmem_case(large, muts));
            Ok(())
        })
        .unwrap();
    seen.check("pmem");
}

// ---------------------------------------------------------------------------
// posix: recovery from damaged store directories.

struct PosixBase {
    /// Files relative to the root: the superblock first, then the chunk
    /// files in name order.
    files: Vec<(PathBuf, Vec<u8>)>,
    keys: Keys,
}

fn posix_base() -> &'static PosixBase {
    static BASE: OnceLock<PosixBase> = OnceLock::new();
    BASE.get_or_init(|| {
        let d = shm_dir();
        let s = PosixStore::open(d.path(), 0).unwrap();
        let keys = populate(&s);
        drop(s);
        let mut files = vec![(
            PathBuf::from(POSIX_SUPER),
            std::fs::read(d.path().join(POSIX_SUPER)).unwrap(),
        )];
        let mut chunks = Vec::new();
        for sub in std::fs::read_dir(d.path()).unwrap() {
            let sub = sub.unwrap();
            if !sub.file_type().unwrap().is_dir() {
                continue;
            }
            for e in std::fs::read_dir(sub.path()).unwrap() {
                let e = e.unwrap().path();
                let rel = e.strip_prefix(d.path()).unwrap().to_path_buf();
                chunks.push((rel, std::fs::read(&e).unwrap()));
            }
        }
        chunks.sort();
        assert!(chunks.len() >= 8);
        files.extend(chunks);
        PosixBase { files, keys }
    })
}

#[derive(Debug, Clone, Copy)]
enum XRegion {
    Slot,
    Path,
    Data,
    Anywhere,
}

#[derive(Debug, Clone)]
enum PosixMut {
    /// Flip a bit of a file (0: the superblock).
    Flip(u64, XRegion, u64, u8),
    /// Set a field of a slot of a chunk file, fixing its checksum.
    SlotField {
        file: u64,
        slot: u8,
        field: u8,
        value: u64,
    },
    /// Give a chunk file another path (fixed in its slots).
    Path {
        file: u64,
        path: Vec<u8>,
    },
    /// Set a superblock field (fixing its checksum).
    SuperField {
        field: u8,
        value: u64,
    },
    Truncate(u64, u64),
    Extend(u64, u64),
    Remove(u64),
    /// Move a chunk file to another id's name.
    Rename(u64, u64),
    /// A foreign file with a chunk file's name.
    Junk(u64, Vec<u8>),
    /// A file (0: the superblock) replaced by something that is not a
    /// regular file: a directory, a FIFO, a dangling symlink.
    Replace(u64, u8),
}

fn posix_mut() -> impl Strategy<Value = PosixMut> {
    let xr = prop_oneof![
        3 => Just(XRegion::Slot),
        1 => Just(XRegion::Path),
        1 => Just(XRegion::Data),
        1 => Just(XRegion::Anywhere),
    ];
    prop_oneof![
        4 => (any::<u64>(), xr, any::<u64>(), 0..8u8)
            .prop_map(|(f, r, at, bit)| PosixMut::Flip(f, r, at, bit)),
        4 => (any::<u64>(), 0..2u8, 0..9u8, edgy_u64())
            .prop_map(|(file, slot, field, value)| PosixMut::SlotField { file, slot, field, value }),
        1 => (any::<u64>(), odd_path()).prop_map(|(file, path)| PosixMut::Path { file, path }),
        1 => (0..4u8, edgy_u64()).prop_map(|(field, value)| PosixMut::SuperField { field, value }),
        2 => (any::<u64>(), edgy_u64()).prop_map(|(f, at)| PosixMut::Truncate(f, at)),
        1 => (any::<u64>(), prop::sample::select(vec![1u64, 512, 8192, 1 << 20, 1 << 33]))
            .prop_map(|(f, by)| PosixMut::Extend(f, by)),
        1 => any::<u64>().prop_map(PosixMut::Remove),
        1 => (any::<u64>(), edgy_u64()).prop_map(|(f, id)| PosixMut::Rename(f, id)),
        1 => (edgy_u64(), prop::collection::vec(any::<u8>(), 0..9000))
            .prop_map(|(id, b)| PosixMut::Junk(id, b)),
        1 => (any::<u64>(), 0..3u8).prop_map(|(f, kind)| PosixMut::Replace(f, kind)),
    ]
}

/// Lays out the base store under `root` and damages it.
fn mutate_posix(base: &PosixBase, root: &Path, muts: &[PosixMut]) {
    for (rel, b) in &base.files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b).unwrap();
    }
    let n = base.files.len() as u64;
    let file = |sel: u64| root.join(&base.files[(sel % n) as usize].0);
    let chunk = |sel: u64| root.join(&base.files[1 + (sel % (n - 1)) as usize].0);
    // Files an earlier mutation replaced by something else are left alone.
    let regular = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
    let open = |p: &Path| {
        if !regular(p) {
            return Err(std::io::Error::other("not a regular file"));
        }
        std::fs::OpenOptions::new().read(true).write(true).open(p)
    };
    for m in muts {
        match m {
            PosixMut::Flip(f, r, at, bit) => {
                // (In place: an earlier mutation may have grown the file
                // to gigabytes.)
                let Ok(fh) = open(&file(*f)) else {
                    continue;
                };
                let len = fh.metadata().unwrap().len();
                if len == 0 {
                    continue;
                }
                let o = match r {
                    XRegion::Slot => slot_off((*at % 2) as u8) + (at >> 8) % SLOT_LEN as u64,
                    XRegion::Path => POSIX_PATH_OFF + (at >> 8) % 16,
                    XRegion::Data => DATA_OFF + (at >> 8) % 4096,
                    XRegion::Anywhere => *at,
                };
                let o = o % len;
                let mut b = [0u8];
                fh.read_exact_at(&mut b, o).unwrap();
                b[0] ^= 1 << bit;
                fh.write_all_at(&b, o).unwrap();
            }
            PosixMut::SlotField {
                file,
                slot,
                field,
                value,
            } => {
                let Ok(f) = open(&chunk(*file)) else {
                    continue;
                };
                let mut b = [0u8; SLOT_LEN];
                if f.read_exact_at(&mut b, slot_off(*slot % 2)).is_ok() {
                    set_slot_field(&mut b, *field, *value);
                    f.write_all_at(&b, slot_off(*slot % 2)).unwrap();
                }
            }
            PosixMut::Path { file, path } => {
                let Ok(f) = open(&chunk(*file)) else {
                    continue;
                };
                f.write_all_at(path, POSIX_PATH_OFF).unwrap();
                for s in 0..2 {
                    let mut b = [0u8; SLOT_LEN];
                    if f.read_exact_at(&mut b, slot_off(s)).is_ok() {
                        b[32..36].copy_from_slice(&(path.len() as u32).to_le_bytes());
                        b[36..40].copy_from_slice(&crc32c(path).to_le_bytes());
                        fix_slot_crc(&mut b);
                        f.write_all_at(&b, slot_off(s)).unwrap();
                    }
                }
            }
            PosixMut::SuperField { field, value } => {
                let Ok(fh) = open(&root.join(POSIX_SUPER)) else {
                    continue;
                };
                if let Some(mut b) = read_file_at(&fh, 0, 64) {
                    let o = [8usize, 12, 16, 24][*field as usize % 4];
                    let w = if o < 16 { 4 } else { 8 };
                    b[o..o + w].copy_from_slice(&value.to_le_bytes()[..w]);
                    let c = crc32c(&b[..40]);
                    b[40..44].copy_from_slice(&c.to_le_bytes());
                    fh.write_all_at(&b, 0).unwrap();
                }
            }
            PosixMut::Truncate(f, at) => {
                if let Ok(f) = open(&file(*f)) {
                    let len = f.metadata().unwrap().len();
                    f.set_len(at % (len + 1)).unwrap();
                }
            }
            PosixMut::Extend(f, by) => {
                // Chunk files grow by at most 1 MiB: a (damaged) header
                // that claims all of a huge file gets all of it read and
                // checksummed at open, as a real chunk of that size would.
                let by = if f % n == 0 { *by } else { (*by).min(1 << 20) };
                if let Ok(f) = open(&file(*f)) {
                    let len = f.metadata().unwrap().len();
                    f.set_len(len + by).unwrap();
                }
            }
            PosixMut::Remove(f) => {
                let _ = std::fs::remove_file(chunk(*f));
            }
            PosixMut::Rename(f, id) => {
                let to = chunk_file(root, *id);
                if std::fs::create_dir_all(to.parent().unwrap()).is_ok() {
                    let _ = std::fs::rename(chunk(*f), to);
                }
            }
            PosixMut::Junk(id, b) => {
                // (best effort: an earlier mutation may have made that path,
                // or its directory, something that cannot be written)
                let to = chunk_file(root, *id);
                if std::fs::create_dir_all(to.parent().unwrap()).is_ok() {
                    let _ = std::fs::write(to, b);
                }
            }
            PosixMut::Replace(f, kind) => {
                let p = file(*f);
                if std::fs::remove_file(&p).is_err() {
                    continue;
                }
                match kind % 3 {
                    0 => std::fs::create_dir(&p).unwrap(),
                    1 => {
                        use std::os::unix::ffi::OsStrExt;
                        let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                        // SAFETY: `c` is a NUL-terminated path that outlives
                        // the call.
                        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
                        assert_eq!(rc, 0, "mkfifo {}", p.display());
                    }
                    _ => std::os::unix::fs::symlink("nowhere", &p).unwrap(),
                }
            }
        }
    }
}

/// Opens a damaged POSIX store: an error or a store that works.
fn posix_case(muts: Vec<PosixMut>) -> bool {
    let what = format!("posix {muts:?}");
    bounded(what.clone(), move || {
        let base = posix_base();
        let d = shm_dir();
        mutate_posix(base, d.path(), &muts);
        let Ok(s) = PosixStore::open(d.path(), 0) else {
            return false;
        };
        let wrote = exercise(&s, &base.keys);
        drop(s);
        let s = PosixStore::open(d.path(), 0)
            .unwrap_or_else(|e| panic!("{what}: opened once, then not: {e}"));
        check_reopened(&s, &wrote, &what);
        let _ = exercise(&s, &base.keys);
        true
    })
}

#[test]
fn fuzz_posix_recovery_from_damaged_directories() {
    let mut runner = proptest::test_runner::TestRunner::new(config(cases(1200, 1)));
    let seen = Outcomes::default();
    runner
        .run(&prop::collection::vec(posix_mut(), 1..4), |muts| {
            seen.add(posix_case(muts));
            Ok(())
        })
        .unwrap();
    seen.check("posix");
}

// ---------------------------------------------------------------------------
// Regressions: failures the fuzzing found, with their literal inputs.

// Each names the input the fuzzing found (selectors pick a record or file
// of the base store by index modulo their number, so they are literal
// positions in its deterministic layout) and spells the damage out.

/// Found as `Path { rec: 8811302793446245414, path: [] }` (pmem) and
/// `Path { file: 1578716303075989678, path: [195, 169] }` (posix): a record
/// whose path (checksum fixed) is "" or "é" made the directory index take
/// `path[1..]` at open: out of bounds, or inside a character.
#[test]
fn regression_record_paths_that_are_not_normalised() {
    assert!(pmem_case(
        false,
        vec![PmemMut::Path {
            rec: 8811302793446245414,
            path: vec![],
        }]
    ));
    assert!(posix_case(vec![PosixMut::Path {
        file: 1578716303075989678,
        path: vec![195, 169],
    }]));
    // The same paths given to the engines directly.
    for (s, _dir) in crate::tests::engines() {
        for p in ["", "é", "a//b", "ü/x"] {
            s.create(p, file_meta(1), b"x", true).unwrap();
            s.list_dir("/", "", 10).unwrap();
            assert_eq!(s.read(p, 0, 1, 0, 10).unwrap().unwrap(), b"x");
            s.remove(p, 0, &mut |_| Ok(())).unwrap();
        }
    }
}

/// Found as `Path { rec: 3124898525605017862, path: b"/d/" }` (pmem, and
/// the same for posix): a record whose path ends in '/' was listed in /d
/// under the name "", which as a listing cursor means "from the start", so
/// paging through /d never ended.
#[test]
fn regression_record_path_with_a_trailing_slash_is_not_listed() {
    assert!(pmem_case(
        false,
        vec![PmemMut::Path {
            rec: 3124898525605017862,
            path: b"/d/".to_vec(),
        }]
    ));
    for (s, _dir) in crate::tests::engines() {
        s.create("/d/", file_meta(1), b"", true).unwrap();
        let (page, done) = s.list_dir("/d", "", 1).unwrap();
        assert!(page.is_empty() && done, "{}: {page:?}", s.name());
        assert!(s.meta("/d/", 0).unwrap().is_some());
    }
}

/// Found as `SuperField { field: 2, value: 0 }`: a pmem superblock with a
/// good checksum and the size 0 made `inspect_pmem` (chfs-store-dump)
/// compute `0 - 4096`. Also: a pmem file cut to 30 bytes made open read
/// the 64-byte superblock past the mapping's end, and one cut to 100 bytes
/// of zeros made it "finish formatting" with `100 - 4096`.
#[test]
fn regression_pmem_superblock_size_out_of_range_and_files_cut_short() {
    assert!(!pmem_case(
        false,
        vec![PmemMut::SuperField { field: 2, value: 0 }]
    ));
    let sb = crate::pmem::Superblock {
        version: PMEM_VERSION,
        size: 0,
        uuid: 1,
    };
    assert!(decode_super(&encode_super(&sb)).is_err());
    for cut in [30, 64, 100, 4096, 4100] {
        assert!(!pmem_case(false, vec![PmemMut::Truncate(cut)]));
    }
    let d = shm_dir();
    for len in [30, 100, 4096] {
        let f = d.path().join(format!("z{len}"));
        std::fs::write(&f, vec![0u8; len]).unwrap();
        let e = PmemStore::open(&f, 0).err().expect("refused");
        assert_eq!(e.errno(), libc::EINVAL, "{len}: {e}");
        assert!(inspect_pmem(&f).is_err());
    }
}

/// Found as `Rename(0, 18446744073709551614)`: a chunk file named with the
/// id u64::MAX - 1 made the next new file take id u64::MAX, and the open
/// after that computed u64::MAX + 1.
#[test]
fn regression_posix_chunk_file_ids_at_the_top() {
    assert!(posix_case(vec![PosixMut::Rename(0, u64::MAX - 1)]));
    assert!(posix_case(vec![PosixMut::Rename(0, u64::MAX)]));
}

/// Found as `SlotField { file: 0, slot: 0, field: 0, value:
/// 18446744073709551614 }` (checksum fixed): a slot with the sequence
/// number u64::MAX - 1 made the open after the next write compute
/// u64::MAX + 1. Then with the value 9223372036854775807 (`MAX_SEQ`, after
/// slots beyond it were refused): data written after it read back, but was
/// gone after a reopen (its slot was beyond `MAX_SEQ`); such writes are now
/// refused.
#[test]
fn regression_slot_sequence_numbers_at_the_top() {
    let top = valid_slot(MAX_SEQ, b"/f", b"data");
    assert_eq!(Slot::decode(&top).unwrap().seq, MAX_SEQ);
    for seq in [MAX_SEQ + 1, u64::MAX - 1, u64::MAX] {
        assert!(Slot::decode(&valid_slot(seq, b"/f", b"data")).is_none());
    }
    for value in [u64::MAX - 1, u64::MAX, MAX_SEQ, MAX_SEQ - 1] {
        for slot in 0..2 {
            let field = 0;
            assert!(posix_case(vec![PosixMut::SlotField {
                file: 0,
                slot,
                field,
                value
            }]));
            for rec in 0..3 {
                pmem_case(
                    false,
                    vec![PmemMut::SlotField {
                        rec,
                        slot,
                        field,
                        value,
                    }],
                );
            }
        }
    }
}

/// Found as `Extend(6569864924720527350, 8589934592)` landing on the
/// superblock: open read the whole 8 GiB (sparse) file into memory.
#[test]
fn regression_posix_superblock_grown_to_8_gib() {
    assert!(posix_case(vec![PosixMut::Extend(0, 1 << 33)]));
}

/// Found as `[Replace(16658664109399317294, 1), Path { .. }]`: with a FIFO
/// in place of the superblock, open waited for a writer forever. A
/// directory there is refused too; a FIFO in place of a chunk file is an
/// unreadable chunk (removed).
#[test]
fn regression_posix_fifo_in_place_of_a_file() {
    assert!(!posix_case(vec![PosixMut::Replace(0, 1)]));
    assert!(!posix_case(vec![PosixMut::Replace(0, 0)]));
    assert!(posix_case(vec![PosixMut::Replace(1, 1)]));
}
