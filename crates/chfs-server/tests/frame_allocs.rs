//! A connection's small frames are read into a buffer used again
//! (issue 25: allocations per request): reading a stat's frame allocates
//! nothing once the previous payload is gone; a payload still held, and
//! the data of a write, keep memory of their own and stay intact.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;

use bytes::{Bytes, BytesMut};
use chfs_proto::frame::Header;
use chfs_proto::Request;
use chfs_server::net::{read_frame_reusing, REUSE_MAX};

/// The system allocator, counting the allocations of each thread.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
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

fn frame(id: u64, req: &Request) -> Vec<u8> {
    let mut p = Vec::new();
    req.encode(&mut p);
    let mut f = Header {
        len: p.len() as u32,
        id,
        op: req.op(),
        flags: 0,
    }
    .encode()
    .to_vec();
    f.extend(p);
    f
}

fn stat(i: u64) -> Request {
    Request::Stat {
        path: format!("/dir/file{i}"),
    }
}

#[test]
fn small_frames_reuse_one_buffer() {
    let write = Request::Write {
        flags: 0,
        epoch: 0,
        path: "/w".into(),
        fileid: 1,
        chunk_size: 4096,
        mode: 0o100644,
        idx: 0,
        off: 0,
        data: Bytes::from(vec![9u8; 1000]),
    };
    let mut stream = Vec::new();
    for i in 0..200 {
        stream.extend(frame(i, &stat(i)));
    }
    stream.extend(frame(200, &write));
    stream.extend(frame(201, &stat(201)));
    stream.extend(frame(202, &stat(202)));
    {
        let mut rd = &stream[..];
        let mut reuse = BytesMut::new();
        let next = |rd: &mut &[u8], reuse: &mut BytesMut| {
            let fut = read_frame_reusing(rd, Some(reuse));
            // `&[u8]` is always ready.
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            match std::pin::pin!(fut).poll(&mut cx) {
                std::task::Poll::Ready(r) => r.unwrap().unwrap(),
                std::task::Poll::Pending => unreachable!(),
            }
        };
        // Warm up: the buffer is allocated (and made shareable) once.
        for i in 0..10 {
            let (h, p) = next(&mut rd, &mut reuse);
            assert_eq!(Request::decode(h.op, p).unwrap(), stat(i));
        }
        let a0 = ALLOCS.with(Cell::get);
        for i in 10..190 {
            let (h, p) = next(&mut rd, &mut reuse);
            assert_eq!(h.id, i);
            drop(p);
        }
        let a1 = ALLOCS.with(Cell::get);
        assert_eq!(a1 - a0, 0, "allocations for 180 frames");
        // A payload still held keeps its bytes; the next frame goes
        // elsewhere.
        let (_, held) = next(&mut rd, &mut reuse);
        let mut later = Vec::new();
        for _ in 191..200 {
            later.push(next(&mut rd, &mut reuse));
        }
        assert_eq!(
            Request::decode(chfs_proto::msg::op::STAT, held).unwrap(),
            stat(190)
        );
        for (i, (h, p)) in later.into_iter().enumerate() {
            assert_eq!(Request::decode(h.op, p).unwrap(), stat(191 + i as u64));
        }
        // A write's data has memory of its own: the buffer is free while
        // it is held.
        let (h, p) = next(&mut rd, &mut reuse);
        let w = Request::decode(h.op, p).unwrap();
        assert_eq!(w, write);
        assert!(reuse.try_reclaim(REUSE_MAX));
        for i in 201..203 {
            let (h, p) = next(&mut rd, &mut reuse);
            assert_eq!(Request::decode(h.op, p).unwrap(), stat(i));
        }
        assert_eq!(w, write);
        assert!(rd.is_empty());
    }
}
