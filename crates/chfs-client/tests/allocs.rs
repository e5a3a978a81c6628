//! Allocations per request on the client side (issue 25): what one stat,
//! create, unlink and 47,008-byte read allocate in the calling thread,
//! counted by a global allocator, against a real chfsd.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use chfs_client::flags;

/// The system allocator, counting the allocations of each thread.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // A thread being torn down has no counter any more: not counted.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per call of `f` over `m` calls (after one to warm up).
fn per_call(m: u64, mut f: impl FnMut(u64)) -> f64 {
    f(m);
    let a0 = ALLOCS.with(Cell::get);
    for i in 0..m {
        f(i);
    }
    (ALLOCS.with(Cell::get) - a0) as f64 / m as f64
}

/// A stat, a create (and close) and an unlink allocate what their request
/// needs (the normalised path, and the request's own copy of it; a create
/// also the open file), not buffers to encode and send it.
#[test]
fn requests_allocate_only_what_they_keep() {
    let (_p, c) = common::pool(1);
    let m = 500;
    let paths: Vec<String> = (0..=m).map(|i| format!("/f{i}")).collect();
    let create = per_call(m, |i| {
        let f = c
            .create(&paths[i as usize], flags::O_WRONLY, 0o644)
            .unwrap();
        c.close(f).unwrap();
    });
    let stat = per_call(m, |i| {
        c.stat(&paths[i as usize]).unwrap();
    });
    let unlink = per_call(m, |i| {
        if i < m {
            c.unlink(&paths[i as usize]).unwrap();
        }
    });
    // Records of 47,008 bytes in 64 KiB chunks, most crossing a chunk
    // boundary.
    let rec = 47_008usize;
    let f = c
        .create("/data", flags::O_RDWR, 0o644)
        .and_then(|f| {
            c.pwrite(f, &vec![7u8; rec * (m as usize + 1)], 0)?;
            Ok(f)
        })
        .unwrap();
    let mut buf = vec![0u8; rec];
    let read = per_call(m, |i| {
        assert_eq!(c.pread(f, &mut buf, i * rec as u64).unwrap(), rec);
    });
    assert!(buf.iter().all(|&x| x == 7));
    eprintln!("allocations per call: create {create:.2}, stat {stat:.2}, unlink {unlink:.2}, read {read:.2}");
    // Before: 5 per stat and unlink (2 of them the encode and frame
    // buffers, 1 the normaliser's list of components), 10 per create.
    assert!(stat <= 2.0, "stat: {stat}");
    assert!(unlink <= 2.0, "unlink: {unlink}");
    assert!(create <= 6.0, "create: {create}");
    // Before: 11.15 (the frame buffer of each of the 1.72 chunk requests,
    // and a list of the chunks' spans).
    assert!(read <= 8.5, "read: {read}");
}
