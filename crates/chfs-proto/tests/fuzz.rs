//! Bounded fuzzing of every decoder of bytes that come from the wire, run by
//! `cargo test` (CI included).
//!
//! Every target feeds a decoder arbitrary bytes and mutated valid encodings
//! (bits flipped, bytes set, inserted and removed, truncated, extended,
//! length prefixes overwritten with huge values, two encodings spliced) and
//! checks that it
//!
//! * never panics;
//! * never allocates much more than its input (a length prefix of 4 G must
//!   not reserve gigabytes): see [`budget`], measured by a counting global
//!   allocator;
//! * when it accepts the bytes, decodes a value that encodes back to the
//!   very same bytes and decodes again to an equal value (no two encodings
//!   of one message);
//! * in the handshake, accepts only the exact proof.
//!
//! The number of cases is `CHFS_FUZZ_CASES` (default [`DEFAULT_CASES`],
//! which keeps the whole file around 10 s in the test profile); every
//! target scales it by its cost. A longer run:
//! `CHFS_FUZZ_CASES=100000 cargo test --release -p chfs-proto --test fuzz`.
//! The seed is random on each run (`PROPTEST_RNG_SEED` fixes it). Nothing is
//! written to `proptest-regressions/`: a failing input that proptest
//! reports (minimised) is added to the regression tests at the end of this
//! file as literal bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeSet;

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::strategy::{Union, ValueTree};
use proptest::test_runner::{Config, TestRunner};

use chfs_proto::frame::{
    CmaRef, Header, FLAG_CMA, FLAG_ERROR, FLAG_FORWARDED, HEADER_LEN, MAX_PAYLOAD,
};
use chfs_proto::handshake::{
    self, Accept, Auth, Connector, Credential, Hello, HelloReply, Keys, Role, Verdict,
    CLIENT_KEY_PREFIX, MAGIC,
};
use chfs_proto::meta::{Meta, META_LEN, META_VERSION};
use chfs_proto::msg::{
    self, op, DirEntry, FlushState, RebalanceState, RemoveKind, ServerStatus, SetAttr, TimeSet,
};
use chfs_proto::path::{self, MAX_NAME, MAX_PATH};
use chfs_proto::ring::{Hashing, Ring, ServerList};
use chfs_proto::{ErrorReply, ProtoError, Request, Response, PROTOCOL_VERSION};

// ---------------------------------------------------------------------------
// Run length and configuration

/// Cases of the main targets when `CHFS_FUZZ_CASES` is not set.
const DEFAULT_CASES: u32 = 1500;

/// The base case count: `CHFS_FUZZ_CASES` or [`DEFAULT_CASES`].
fn base_cases() -> u32 {
    std::env::var("CHFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// A configuration running `percent` % of the base case count (at least
/// one case), writing no failure files (failures become regression tests
/// in this file instead).
fn cfg(percent: u32) -> Config {
    let cases = (u64::from(base_cases()) * u64::from(percent) / 100).clamp(1, u64::from(u32::MAX));
    Config {
        cases: cases as u32,
        failure_persistence: None,
        // Minimising a failure may take a while, but not for ever.
        max_shrink_time: 60_000,
        ..Config::default()
    }
}

// ---------------------------------------------------------------------------
// Allocation metering

/// The global allocator of this test binary: the system's, counting the
/// bytes each thread allocates while [`metered`] runs.
struct Metered;

thread_local! {
    static METERING: Cell<bool> = const { Cell::new(false) };
    static METERED_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // Const-initialised thread-locals without destructors: no allocation,
    // no registration; `try_with` also works while the thread exits.
    let _ = METERING.try_with(|on| {
        if on.get() {
            let _ = METERED_BYTES.try_with(|b| b.set(b.get().saturating_add(size)));
        }
    });
}

// SAFETY: every call is passed unchanged to the system allocator; the
// bookkeeping neither allocates nor unwinds.
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: our caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: our caller upholds `GlobalAlloc::realloc`'s contract, and
        // `ptr` came from `System` through us.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through us, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Metered = Metered;

/// Runs `f`; returns its result and the bytes this thread allocated in it
/// (every allocation and reallocation counted in full, frees ignored).
fn metered<T>(f: impl FnOnce() -> T) -> (T, usize) {
    METERED_BYTES.with(|b| b.set(0));
    METERING.with(|m| m.set(true));
    let t = f();
    METERING.with(|m| m.set(false));
    (t, METERED_BYTES.with(|b| b.get()))
}

/// Most a decoder may allocate for an input of `len` bytes: the strings and
/// vectors it copies out (a few times the input: a `String` or a
/// `DirEntry` takes more room than its encoding), an error message, and
/// small constant overheads. Nothing proportional to what a length field
/// *claims*.
fn budget(len: usize) -> usize {
    4096 + 16 * len
}

// ---------------------------------------------------------------------------
// Strategies: valid values of every message

/// Every request opcode (checked against the decoder by
/// `opcode_tables_are_complete`).
const REQUEST_OPS: &[u16] = &[
    op::PING,
    op::GET_SERVERS,
    op::JOIN,
    op::UPDATE_SERVERS,
    op::STATUS,
    op::SHUTDOWN,
    op::CREATE,
    op::STAT,
    op::WRITE,
    op::READ,
    op::SET_SIZE,
    op::SET_ATTR,
    op::REMOVE_ENTRY,
    op::REMOVE_CHUNKS,
    op::TRUNCATE_CHUNKS,
    op::READDIR,
    op::HAS_CHILDREN,
    op::RENAME_MOVE,
    op::PUT_CHUNK,
    op::APPEND_RESERVE,
    op::READDIR_DIRS,
    op::SYNC,
    op::FLUSH_STATUS,
    op::FLUSH,
    op::REBALANCE,
    op::ADOPT_CHUNK,
    op::LANE,
    op::SHM_ATTACH,
    op::LOOKUP,
    op::WATCH_STAT,
    op::INVALIDATE,
    op::NODE_LOCAL,
    op::LIST_TREE,
    op::DIR_VERSION,
    op::READ_SPANS,
    op::STAT_DATA,
    op::WRITE_SPANS,
    op::READ_SPANS_PLACED,
];

/// Number of response tags (0 .. this), checked by
/// `opcode_tables_are_complete`.
const RESPONSE_TAGS: u8 = 16;

/// Short strings: paths, names, addresses, messages, odd characters.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => select(vec!["", "/", "/a", "/a/b", "x", "h:1", "..", "é", "a\0b", "/d/e/f"])
            .prop_map(String::from),
        2 => vec(any::<char>(), 0..10).prop_map(String::from_iter),
    ]
    .boxed()
}

/// Bulk data (payload tails).
fn blob() -> BoxedStrategy<Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from).boxed()
}

fn any_meta() -> BoxedStrategy<Meta> {
    (
        (
            any::<u16>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
        ),
        (
            any::<u32>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<u32>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (flags, mode, uid, gid, size, chunk_size),
                (rdev, mtime, ctime, atime, fileid, crc),
            )| {
                Meta {
                    flags,
                    mode,
                    uid,
                    gid,
                    size,
                    chunk_size,
                    rdev,
                    mtime,
                    ctime,
                    atime,
                    fileid,
                    crc,
                }
            },
        )
        .boxed()
}

/// A server list in its canonical form (`since` empty, or one entry per
/// server and not all zero), which is what a decoder returns.
fn any_list() -> BoxedStrategy<ServerList> {
    (
        any::<u64>(),
        any::<bool>(),
        vec(
            (text(), prop_oneof![3 => Just(0u64), 1 => any::<u64>()]),
            0..5,
        ),
    )
        .prop_map(|(version, consistent, entries)| {
            let servers = entries.iter().map(|e| e.0.clone()).collect();
            let mut since: Vec<u64> = entries.iter().map(|e| e.1).collect();
            if since.iter().all(|&v| v == 0) {
                since.clear();
            }
            ServerList {
                version,
                hashing: if consistent {
                    Hashing::Consistent
                } else {
                    Hashing::Modular
                },
                servers,
                since,
            }
        })
        .boxed()
}

fn any_time() -> BoxedStrategy<TimeSet> {
    prop_oneof![
        Just(TimeSet::Omit),
        Just(TimeSet::Now),
        any::<i64>().prop_map(TimeSet::At),
    ]
    .boxed()
}

fn any_flush() -> BoxedStrategy<FlushState> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        text(),
        any::<i32>(),
    )
        .prop_map(
            |(chunks, bytes, failing, last_error, last_errno)| FlushState {
                chunks,
                bytes,
                failing,
                last_error,
                last_errno,
            },
        )
        .boxed()
}

/// One strategy per request variant, with its opcode.
fn request_arms() -> Vec<(u16, BoxedStrategy<Request>)> {
    vec![
        (op::PING, Just(Request::Ping).boxed()),
        (op::GET_SERVERS, Just(Request::GetServers).boxed()),
        (op::STATUS, Just(Request::Status).boxed()),
        (op::SHUTDOWN, Just(Request::Shutdown).boxed()),
        (op::SYNC, Just(Request::Sync).boxed()),
        (
            op::REBALANCE,
            any::<bool>()
                .prop_map(|start| Request::Rebalance { start })
                .boxed(),
        ),
        (
            op::LANE,
            any::<u32>().prop_map(|cpu| Request::Lane { cpu }).boxed(),
        ),
        (
            op::SHM_ATTACH,
            (any::<i32>(), any::<u64>(), any::<u64>())
                .prop_map(|(fd, base, len)| Request::ShmAttach { fd, base, len })
                .boxed(),
        ),
        (
            op::LOOKUP,
            (text(), any::<u32>())
                .prop_map(|(path, max_age_ms)| Request::Lookup { path, max_age_ms })
                .boxed(),
        ),
        (
            op::WATCH_STAT,
            (text(), text(), any::<u32>())
                .prop_map(|(path, contact, keep_ms)| Request::WatchStat {
                    path,
                    contact,
                    keep_ms,
                })
                .boxed(),
        ),
        (
            op::INVALIDATE,
            text().prop_map(|path| Request::Invalidate { path }).boxed(),
        ),
        (
            op::NODE_LOCAL,
            text()
                .prop_map(|prefix| Request::NodeLocal { prefix })
                .boxed(),
        ),
        (
            op::LIST_TREE,
            (text(), text(), any::<u32>(), any::<u8>())
                .prop_map(|(prefix, after, max, flags)| Request::ListTree {
                    prefix,
                    after,
                    max,
                    flags,
                })
                .boxed(),
        ),
        (
            op::DIR_VERSION,
            text().prop_map(|path| Request::DirVersion { path }).boxed(),
        ),
        (
            op::STAT_DATA,
            (text(), any::<u32>())
                .prop_map(|(path, max)| Request::StatData { path, max })
                .boxed(),
        ),
        (
            op::READ_SPANS,
            (
                text(),
                any::<u32>(),
                any::<u32>(),
                any::<u16>(),
                any::<u32>(),
                vec((any::<u64>(), any::<u32>(), 0u32..(1 << 20)), 0..8),
            )
                .prop_map(
                    |(path, fileid, chunk_size, flags, epoch, spans)| Request::ReadSpans {
                        path,
                        fileid,
                        chunk_size,
                        flags,
                        epoch,
                        spans,
                    },
                )
                .boxed(),
        ),
        (
            op::READ_SPANS_PLACED,
            (
                text(),
                any::<u32>(),
                any::<u32>(),
                any::<u16>(),
                any::<u32>(),
                vec((any::<u64>(), any::<u32>(), 0u32..(1 << 20)), 0..8),
            )
                .prop_map(|(path, fileid, chunk_size, flags, epoch, spans)| {
                    Request::ReadSpansPlaced {
                        path,
                        fileid,
                        chunk_size,
                        flags,
                        epoch,
                        spans,
                    }
                })
                .boxed(),
        ),
        (
            op::WRITE_SPANS,
            (
                text(),
                (any::<u32>(), any::<u32>(), any::<u32>()),
                any::<u16>(),
                any::<u32>(),
                vec((any::<u64>(), any::<u32>(), vec(any::<u8>(), 0..40)), 0..8),
            )
                .prop_map(|(path, (fileid, chunk_size, mode), flags, epoch, parts)| {
                    let spans = parts
                        .iter()
                        .map(|(i, o, d)| (*i, *o, d.len() as u32))
                        .collect();
                    let data: Vec<u8> = parts.into_iter().flat_map(|p| p.2).collect();
                    Request::WriteSpans {
                        path,
                        fileid,
                        chunk_size,
                        mode,
                        flags,
                        epoch,
                        spans,
                        data: data.into(),
                    }
                })
                .boxed(),
        ),
        (
            op::JOIN,
            (text(), any::<bool>())
                .prop_map(|(addr, fresh)| Request::Join { addr, fresh })
                .boxed(),
        ),
        (
            op::UPDATE_SERVERS,
            any_list()
                .prop_map(|list| Request::UpdateServers { list })
                .boxed(),
        ),
        (
            op::CREATE,
            (text(), any_meta(), any::<bool>(), blob())
                .prop_map(|(path, meta, excl, data)| Request::Create {
                    path,
                    meta,
                    excl,
                    data,
                })
                .boxed(),
        ),
        (
            op::STAT,
            text().prop_map(|path| Request::Stat { path }).boxed(),
        ),
        (
            op::HAS_CHILDREN,
            text()
                .prop_map(|path| Request::HasChildren { path })
                .boxed(),
        ),
        (
            op::WRITE,
            (
                text(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u16>(),
                any::<u32>(),
                blob(),
            )
                .prop_map(
                    |(path, fileid, chunk_size, mode, idx, off, flags, epoch, data)| {
                        Request::Write {
                            path,
                            fileid,
                            chunk_size,
                            mode,
                            idx,
                            off,
                            flags,
                            epoch,
                            data,
                        }
                    },
                )
                .boxed(),
        ),
        (
            op::READ,
            (
                text(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u16>(),
                any::<u32>(),
            )
                .prop_map(
                    |(path, fileid, idx, off, len, chunk_size, flags, epoch)| Request::Read {
                        path,
                        fileid,
                        idx,
                        off,
                        len,
                        chunk_size,
                        flags,
                        epoch,
                    },
                )
                .boxed(),
        ),
        (
            op::SET_SIZE,
            (
                text(),
                any::<u64>(),
                any::<bool>(),
                option::of(any::<u64>()),
                any::<bool>(),
            )
                .prop_map(|(path, size, grow_only, if_size, stray)| Request::SetSize {
                    path,
                    size,
                    grow_only,
                    if_size,
                    stray,
                })
                .boxed(),
        ),
        (
            op::SET_ATTR,
            (
                text(),
                option::of(any::<u32>()),
                option::of(any::<u32>()),
                option::of(any::<u32>()),
                any_time(),
                any_time(),
            )
                .prop_map(|(path, mode, uid, gid, atime, mtime)| Request::SetAttr {
                    path,
                    attr: SetAttr {
                        mode,
                        uid,
                        gid,
                        atime,
                        mtime,
                    },
                })
                .boxed(),
        ),
        (
            op::REMOVE_ENTRY,
            (text(), any::<bool>())
                .prop_map(|(path, dir)| Request::RemoveEntry {
                    path,
                    kind: if dir {
                        RemoveKind::Dir
                    } else {
                        RemoveKind::NotDir
                    },
                })
                .boxed(),
        ),
        (
            op::REMOVE_CHUNKS,
            (text(), any::<u64>())
                .prop_map(|(path, from_idx)| Request::RemoveChunks { path, from_idx })
                .boxed(),
        ),
        (
            op::TRUNCATE_CHUNKS,
            (text(), any::<u64>(), any::<u32>())
                .prop_map(|(path, size, chunk_size)| Request::TruncateChunks {
                    path,
                    size,
                    chunk_size,
                })
                .boxed(),
        ),
        (
            op::READDIR,
            (text(), text(), any::<u32>())
                .prop_map(|(path, after, max)| Request::Readdir { path, after, max })
                .boxed(),
        ),
        (
            op::READDIR_DIRS,
            (text(), text(), any::<u32>())
                .prop_map(|(path, after, max)| Request::ReaddirDirs { path, after, max })
                .boxed(),
        ),
        (
            op::RENAME_MOVE,
            (text(), text(), any::<bool>())
                .prop_map(|(old, new, is_dir)| Request::RenameMove { old, new, is_dir })
                .boxed(),
        ),
        (
            op::PUT_CHUNK,
            (text(), any::<u64>(), any_meta(), blob())
                .prop_map(|(path, idx, meta, data)| Request::PutChunk {
                    path,
                    idx,
                    meta,
                    data,
                })
                .boxed(),
        ),
        (
            op::ADOPT_CHUNK,
            (text(), any::<u64>(), any_meta(), blob())
                .prop_map(|(path, idx, meta, data)| Request::AdoptChunk {
                    path,
                    idx,
                    meta,
                    data,
                })
                .boxed(),
        ),
        (
            op::APPEND_RESERVE,
            (text(), any::<u64>())
                .prop_map(|(path, len)| Request::AppendReserve { path, len })
                .boxed(),
        ),
        (
            op::FLUSH_STATUS,
            text()
                .prop_map(|prefix| Request::FlushStatus { prefix })
                .boxed(),
        ),
        (
            op::FLUSH,
            text().prop_map(|prefix| Request::Flush { prefix }).boxed(),
        ),
    ]
}

/// A valid request of any variant.
fn any_request() -> BoxedStrategy<Request> {
    Union::new(request_arms().into_iter().map(|(_, s)| s)).boxed()
}

/// One strategy per response variant, with its tag.
fn response_arms() -> Vec<(u8, BoxedStrategy<Response>)> {
    vec![
        (0, Just(Response::Ok).boxed()),
        (1, any_list().prop_map(Response::Servers).boxed()),
        (
            2,
            (text(), text(), text(), vec(any::<u64>(), 43), any_flush())
                .prop_map(|(addr, store, backend, n, flush)| {
                    Response::Status(Box::new(ServerStatus {
                        addr,
                        store,
                        entries: n[0],
                        bytes: n[1],
                        capacity: n[2],
                        requests: n[3],
                        cma_writes: n[4],
                        shm_writes: n[5],
                        list_version: n[6],
                        since: n[7],
                        lost: n[8],
                        refused: n[9],
                        denied: n[10],
                        over_limit: n[11],
                        idle_closed: n[12],
                        throttled: n[13],
                        forwarded: n[14],
                        reads: n[15],
                        writes: n[16],
                        poll_hits: n[17],
                        poll_misses: n[18],
                        cpu_ns: n[19],
                        connections: n[20],
                        peers: n[21],
                        lookups: n[22],
                        lookup_hits: n[23],
                        lookup_forwards: n[24],
                        node_local_entries: n[25],
                        node_local_bytes: n[26],
                        fabric_sessions: n[27],
                        fabric_expired: n[28],
                        rma_pulls: n[29],
                        rma_pushes: n[30],
                        reg_fallbacks: n[31],
                        fabric_peers: n[32],
                        fabric_no_session: n[33],
                        fabric_no_session_dropped: n[34],
                        fabric_replies_dropped: n[35],
                        fabric_lent_pulls: n[36],
                        fabric_rma_most: n[37],
                        fabric_hellos_dropped: n[38],
                        shm_reads: n[39],
                        rss: n[40],
                        heap_free: n[41],
                        heap_trims: n[42],
                        backend,
                        flush,
                    }))
                })
                .boxed(),
        ),
        (3, any_meta().prop_map(Response::Meta).boxed()),
        (
            15,
            (any_meta(), vec(any::<u8>(), 0..64))
                .prop_map(|(meta, data)| Response::MetaData {
                    meta,
                    data: Bytes::from(data),
                })
                .boxed(),
        ),
        (
            4,
            (any_meta(), any::<bool>())
                .prop_map(|(meta, created)| Response::Created { meta, created })
                .boxed(),
        ),
        (5, any::<u32>().prop_map(Response::Written).boxed()),
        (6, blob().prop_map(Response::Data).boxed()),
        (
            7,
            (vec((text(), any_meta()), 0..4), any::<bool>())
                .prop_map(|(entries, done)| Response::Entries {
                    entries: entries
                        .into_iter()
                        .map(|(name, meta)| DirEntry { name, meta })
                        .collect(),
                    done,
                })
                .boxed(),
        ),
        (8, any::<bool>().prop_map(Response::Bool).boxed()),
        (9, any::<u64>().prop_map(Response::Count).boxed()),
        (10, any_flush().prop_map(Response::FlushState).boxed()),
        (
            11,
            (any::<bool>(), vec(any::<u64>(), 4), text(), any::<i32>())
                .prop_map(|(running, n, last_error, last_errno)| {
                    Response::Rebalance(RebalanceState {
                        running,
                        version: n[0],
                        moved: n[1],
                        kept: n[2],
                        failed: n[3],
                        last_error,
                        last_errno,
                    })
                })
                .boxed(),
        ),
        (
            12,
            (any_meta(), any::<u64>())
                .prop_map(|(meta, before)| Response::Sized { meta, before })
                .boxed(),
        ),
        (
            13,
            (
                vec((text(), any_meta()), 0..5),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(|(entries, with_meta, done)| {
                    let mut t = chfs_proto::msg::TreePage {
                        done,
                        ..Default::default()
                    };
                    for (p, m) in &entries {
                        t.push(p, m, with_meta);
                    }
                    Response::Tree(t)
                })
                .boxed(),
        ),
        (
            14,
            vec(any::<u64>(), 3)
                .prop_map(|n| {
                    Response::DirVersion(chfs_proto::msg::DirVersion {
                        born: n[0],
                        changes: n[1],
                        list: n[2],
                    })
                })
                .boxed(),
        ),
    ]
}

/// A valid response of any variant.
fn any_response() -> BoxedStrategy<Response> {
    Union::new(response_arms().into_iter().map(|(_, s)| s)).boxed()
}

fn any_error() -> BoxedStrategy<ErrorReply> {
    (any::<i32>(), text())
        .prop_map(|(errno, message)| ErrorReply { errno, message })
        .boxed()
}

fn enc_request(r: &Request) -> Vec<u8> {
    let mut b = Vec::new();
    r.encode(&mut b);
    b
}

fn enc_response(r: &Response) -> Vec<u8> {
    let mut b = Vec::new();
    r.encode(&mut b);
    b
}

fn enc_error(e: &ErrorReply) -> Vec<u8> {
    let mut b = Vec::new();
    msg::encode_error(&mut b, e);
    b
}

// ---------------------------------------------------------------------------
// Mutations

/// One change to an encoding.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR a byte with a non-zero mask.
    Flip(Index, u8),
    /// Overwrite a byte.
    Set(Index, u8),
    /// Cut the encoding there.
    Truncate(Index),
    /// Add bytes at the end.
    Append(Vec<u8>),
    /// Insert bytes.
    Insert(Index, Vec<u8>),
    /// Remove up to this many bytes.
    Remove(Index, u8),
    /// Overwrite a length prefix (a u32 no larger than what follows it,
    /// where there is one) with this value.
    Length(Index, u32),
    /// Overwrite 8 bytes (an index, a size, a count).
    Word(Index, u64),
    /// Keep this prefix, then the other encoding from that position on.
    Splice(Index, Index),
    /// Insert a copy of a part of the encoding (a repeated field).
    Repeat(Index, Index, Index),
}

/// Length values that decoders must survive.
fn huge_len() -> BoxedStrategy<u32> {
    prop_oneof![
        Just(u32::MAX),
        Just(u32::MAX - 3),
        Just(0x8000_0000),
        Just(0x0100_0000),
        Just(1 << 20),
        Just(MAX_PAYLOAD),
        Just(MAX_PAYLOAD + 1),
        0u32..300,
        any::<u32>(),
    ]
    .boxed()
}

fn mutation() -> BoxedStrategy<Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        1 => vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
        1 => (any::<Index>(), vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1u8..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        3 => (any::<Index>(), huge_len()).prop_map(|(i, v)| Mutation::Length(i, v)),
        1 => (any::<Index>(), any::<u64>()).prop_map(|(i, v)| Mutation::Word(i, v)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Splice(a, b)),
        1 => (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(a, b, c)| Mutation::Repeat(a, b, c)),
    ]
    .boxed()
}

fn mutations() -> BoxedStrategy<Vec<Mutation>> {
    vec(mutation(), 1..5).boxed()
}

/// Position `i` in `0..=len`.
fn pos(i: &Index, len: usize) -> usize {
    i.index(len + 1)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Applies `m` to `b`; `other` is a second valid encoding (for splices).
fn apply(b: &mut Vec<u8>, m: &Mutation, other: &[u8]) {
    match m {
        Mutation::Flip(i, mask) if !b.is_empty() => {
            let at = i.index(b.len());
            b[at] ^= mask;
        }
        Mutation::Set(i, v) if !b.is_empty() => {
            let at = i.index(b.len());
            b[at] = *v;
        }
        Mutation::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        Mutation::Append(x) => b.extend_from_slice(x),
        Mutation::Insert(i, x) => {
            let at = pos(i, b.len());
            b.splice(at..at, x.iter().copied());
        }
        Mutation::Remove(i, n) if !b.is_empty() => {
            let at = i.index(b.len());
            let end = (at + usize::from(*n)).min(b.len());
            b.drain(at..end);
        }
        Mutation::Length(i, v) => {
            if b.len() < 4 {
                b.extend_from_slice(&v.to_le_bytes());
                return;
            }
            // Places that hold a plausible length prefix.
            let prefixes: Vec<usize> = (0..=b.len() - 4)
                .filter(|&at| u32_at(b, at) as usize <= b.len() - at - 4)
                .collect();
            let at = if prefixes.is_empty() {
                i.index(b.len() - 3)
            } else {
                *i.get(&prefixes)
            };
            b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        Mutation::Word(i, v) => {
            if b.len() < 8 {
                b.extend_from_slice(&v.to_le_bytes());
                return;
            }
            let at = i.index(b.len() - 7);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        Mutation::Splice(i, j) => {
            b.truncate(pos(i, b.len()));
            b.extend_from_slice(&other[pos(j, other.len())..]);
        }
        Mutation::Repeat(i, j, k) if !b.is_empty() => {
            let from = i.index(b.len());
            let to = from + j.index(b.len() - from) + 1;
            let part = b[from..to].to_vec();
            let at = pos(k, b.len());
            b.splice(at..at, part);
        }
        _ => {}
    }
}

fn mutated(base: &[u8], other: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut b = base.to_vec();
    for m in ms {
        apply(&mut b, m, other);
    }
    b
}

/// Arbitrary bytes, mostly short.
fn junk() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..64),
        1 => vec(any::<u8>(), 64..512),
    ]
    .boxed()
}

/// Any opcode, mostly known ones.
fn any_op() -> BoxedStrategy<u16> {
    prop_oneof![
        3 => select(REQUEST_OPS),
        1 => any::<u16>(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------
// Checks shared by the targets

/// Decodes a request payload received with opcode `op`: no panic, bounded
/// allocation, and an accepted payload is the canonical encoding of what
/// was decoded.
fn check_request(op: u16, payload: &[u8]) -> Result<(), TestCaseError> {
    let input = Bytes::copy_from_slice(payload);
    let (res, used) = metered(|| Request::decode(op, input));
    prop_assert!(
        used <= budget(payload.len()),
        "Request::decode(op {op}) of {} bytes allocated {used} bytes",
        payload.len()
    );
    match res {
        Ok(req) => {
            prop_assert_eq!(req.op(), op);
            let again = enc_request(&req);
            prop_assert_eq!(&again[..], payload, "{:?} re-encodes differently", req);
            let twice = Request::decode(op, Bytes::from(again));
            prop_assert_eq!(twice.ok(), Some(req.clone()));
            let _ = req.key();
            if let Request::UpdateServers { list } = &req {
                check_ring(list)?;
            }
        }
        Err(e) => {
            prop_assert_eq!(e.errno(), libc::EPROTO);
            let _ = e.to_string();
            if !REQUEST_OPS.contains(&op) {
                prop_assert!(matches!(e, ProtoError::UnknownOp(o) if o == op), "{e:?}");
            }
        }
    }
    Ok(())
}

/// Decodes a response payload; as [`check_request`].
fn check_response(payload: &[u8]) -> Result<(), TestCaseError> {
    let input = Bytes::copy_from_slice(payload);
    let (res, used) = metered(|| Response::decode(input));
    prop_assert!(
        used <= budget(payload.len()),
        "Response::decode of {} bytes allocated {used} bytes",
        payload.len()
    );
    match res {
        Ok(resp) => {
            let again = enc_response(&resp);
            prop_assert_eq!(&again[..], payload, "{:?} re-encodes differently", resp);
            let twice = Response::decode(Bytes::from(again));
            prop_assert_eq!(twice.ok(), Some(resp.clone()));
            if let Response::Servers(list) = &resp {
                check_ring(list)?;
            }
        }
        Err(e) => {
            prop_assert_eq!(e.errno(), libc::EPROTO);
            let _ = e.to_string();
        }
    }
    Ok(())
}

/// Decodes an error payload; as [`check_request`].
fn check_error(payload: &[u8]) -> Result<(), TestCaseError> {
    let input = Bytes::copy_from_slice(payload);
    let (res, used) = metered(|| msg::decode_error(input));
    prop_assert!(
        used <= budget(payload.len()),
        "decode_error of {} bytes allocated {used} bytes",
        payload.len()
    );
    if let Ok(e) = res {
        let again = enc_error(&e);
        prop_assert_eq!(&again[..], payload);
        prop_assert_eq!(msg::decode_error(Bytes::from(again)).ok(), Some(e.clone()));
        // Shown to users: must not panic for any errno.
        let _ = e.to_string();
    }
    Ok(())
}

/// A received server list can be placed on: the owner of any key is one of
/// its servers.
fn check_ring(list: &ServerList) -> Result<(), TestCaseError> {
    if list.servers.len() > 64 {
        return Ok(());
    }
    let ring = Ring::new(list.clone());
    prop_assert_eq!(ring.len(), list.servers.len());
    for (p, idx) in [("/", 0u64), ("/a", 7), ("/b/c", u64::MAX)] {
        let o = ring.owner(p, idx);
        prop_assert!(ring.is_empty() || o < ring.len());
    }
    for (i, _) in list.servers.iter().enumerate() {
        let _ = list.since(i);
    }
    Ok(())
}

/// Reads a stream of request frames as a server does (header, payload,
/// `FLAG_CMA` reference at its end).
fn check_request_frames(stream: &[u8]) -> Result<(), TestCaseError> {
    let mut rest = stream;
    while rest.len() >= HEADER_LEN {
        let hb: [u8; HEADER_LEN] = rest[..HEADER_LEN].try_into().expect("header");
        let h = match Header::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                prop_assert!(matches!(e, ProtoError::FrameTooLarge { .. }), "{e:?}");
                return Ok(());
            }
        };
        prop_assert_eq!(h.encode(), hb);
        let body = &rest[HEADER_LEN..];
        let Some(payload) = body.get(..h.len as usize) else {
            return Ok(()); // the rest of the frame has not arrived
        };
        if h.flags & FLAG_CMA != 0 {
            check_cma(payload)?;
            if let Ok((head, _)) = CmaRef::split_off(payload) {
                check_request(op::WRITE, head)?;
            }
        } else {
            check_request(h.op, payload)?;
        }
        rest = &body[payload.len()..];
    }
    Ok(())
}

/// Reads a stream of response frames as a client does.
fn check_response_frames(stream: &[u8]) -> Result<(), TestCaseError> {
    let mut rest = stream;
    while rest.len() >= HEADER_LEN {
        let hb: [u8; HEADER_LEN] = rest[..HEADER_LEN].try_into().expect("header");
        let Ok(h) = Header::decode(&hb) else {
            return Ok(());
        };
        let body = &rest[HEADER_LEN..];
        let Some(payload) = body.get(..h.len as usize) else {
            return Ok(());
        };
        if h.flags & FLAG_ERROR != 0 {
            check_error(payload)?;
        } else {
            check_response(payload)?;
        }
        rest = &body[payload.len()..];
    }
    Ok(())
}

/// Splits a `FLAG_CMA` reference off a payload.
fn check_cma(payload: &[u8]) -> Result<(), TestCaseError> {
    match CmaRef::split_off(payload) {
        Ok((rest, r)) => {
            prop_assert!(r.len <= u64::from(MAX_PAYLOAD));
            prop_assert_eq!(rest.len() + CmaRef::LEN, payload.len());
            let mut again = rest.to_vec();
            again.extend_from_slice(&r.encode());
            prop_assert_eq!(&again[..], payload);
        }
        Err(ProtoError::Truncated { needed }) => {
            prop_assert!(payload.len() < CmaRef::LEN);
            prop_assert_eq!(needed, CmaRef::LEN - payload.len());
        }
        Err(ProtoError::FrameTooLarge { len, .. }) => {
            prop_assert!(len > u64::from(MAX_PAYLOAD));
            prop_assert!(payload.len() >= CmaRef::LEN);
        }
        Err(e) => prop_assert!(false, "unexpected {e:?}"),
    }
    Ok(())
}

/// A hello reply read from a byte stream as a connector reads it
/// (`chfs-server/src/net.rs`, `chfs-client/src/conn.rs`): the reply, the
/// bytes it took and whether its message was UTF-8; None if the stream ends
/// first.
fn read_hello_reply(s: &[u8]) -> Result<Option<(HelloReply, usize, bool)>, ProtoError> {
    let Some(fixed) = s.get(..HelloReply::FIXED_LEN) else {
        return Ok(None);
    };
    let (version, status, n) = HelloReply::decode_fixed(fixed.try_into().expect("fixed"))?;
    assert!(n <= 4096, "message of {n} bytes accepted");
    let mut at = HelloReply::FIXED_LEN;
    let Some(message) = s.get(at..at + n) else {
        return Ok(None);
    };
    at += n;
    let mut auth = Auth::Open;
    if status == 0 {
        let Some(&a) = s.get(at) else {
            return Ok(None);
        };
        at += HelloReply::AUTH_LEN;
        if HelloReply::decode_auth(a)? {
            let Some(ch) = s.get(at..at + HelloReply::CHALLENGE_LEN) else {
                return Ok(None);
            };
            at += HelloReply::CHALLENGE_LEN;
            auth = HelloReply::decode_challenge(ch.try_into().expect("challenge"));
        }
    }
    let utf8 = std::str::from_utf8(message).is_ok();
    Ok(Some((
        HelloReply {
            version,
            status,
            message: String::from_utf8_lossy(message).into_owned(),
            auth,
        },
        at,
        utf8,
    )))
}

/// Reads a hello reply: it re-encodes to the bytes it came from.
fn check_hello_reply(s: &[u8]) -> Result<Option<HelloReply>, TestCaseError> {
    match read_hello_reply(s) {
        Ok(Some((r, used, utf8))) => {
            if utf8 {
                prop_assert_eq!(&r.encode()[..], &s[..used]);
            }
            if let Auth::Challenge { nonce, proof } = &r.auth {
                prop_assert_eq!(&nonce[..], &s[used - 64..used - 32]);
                prop_assert_eq!(&proof[..], &s[used - 32..used]);
            }
            Ok(Some(r))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            prop_assert!(
                matches!(e, ProtoError::BadMagic | ProtoError::Malformed(_)),
                "{e:?}"
            );
            Ok(None)
        }
    }
}

/// Reads a verdict (fixed part, message): it re-encodes to its bytes.
fn check_verdict(s: &[u8]) -> Result<Option<Verdict>, TestCaseError> {
    let Some(fixed) = s.get(..Verdict::FIXED_LEN) else {
        return Ok(None);
    };
    let (status, n) = match Verdict::decode_fixed(fixed.try_into().expect("fixed")) {
        Ok(x) => x,
        Err(e) => {
            prop_assert!(matches!(e, ProtoError::Malformed(_)), "{e:?}");
            prop_assert!(u16::from_le_bytes([s[4], s[5]]) > 4096);
            return Ok(None);
        }
    };
    let Some(m) = s.get(Verdict::FIXED_LEN..Verdict::FIXED_LEN + n) else {
        return Ok(None);
    };
    let v = Verdict {
        status,
        message: String::from_utf8_lossy(m).into_owned(),
    };
    if std::str::from_utf8(m).is_ok() {
        prop_assert_eq!(&v.encode()[..], &s[..Verdict::FIXED_LEN + n]);
    }
    let outcome = Connector::on_verdict(v.status, &v.message);
    prop_assert_eq!(outcome.is_ok(), status == 0);
    Ok(Some(v))
}

/// What the acceptor decides for a hello follows the rules: another
/// version is refused (EPROTO), a pool without a secret lets everyone in,
/// a pool with one refuses a connector without a key (EACCES) and
/// challenges the others; no proof but the exact one passes.
fn check_accept(hello: &Hello, keys: Option<&Keys>) -> Result<(), TestCaseError> {
    let decision = handshake::accept(hello, keys);
    let reply = match &decision {
        Accept::Refuse(r) | Accept::Open(r) | Accept::Challenge(r, _) => r.clone(),
    };
    prop_assert_eq!(reply.version, PROTOCOL_VERSION);
    // The reply reads back as sent.
    let wire = reply.encode();
    let back = check_hello_reply(&wire)?;
    prop_assert_eq!(back.as_ref(), Some(&reply));
    match decision {
        Accept::Refuse(r) => {
            let want = if hello.version != PROTOCOL_VERSION {
                libc::EPROTO
            } else {
                prop_assert!(keys.is_some() && !hello.has_key);
                libc::EACCES
            };
            prop_assert_eq!(r.status, want);
        }
        Accept::Open(r) => {
            prop_assert_eq!(hello.version, PROTOCOL_VERSION);
            prop_assert!(keys.is_none());
            prop_assert_eq!((r.status, r.auth), (0, Auth::Open));
        }
        Accept::Challenge(r, pending) => {
            prop_assert_eq!(hello.version, PROTOCOL_VERSION);
            prop_assert!(keys.is_some() && hello.has_key);
            prop_assert_eq!(r.status, 0);
            let Auth::Challenge { nonce, proof } = r.auth else {
                return Err(TestCaseError::fail("challenge without a challenge"));
            };
            prop_assert_ne!(nonce, hello.nonce);
            // Reflecting the acceptor's own proof, or the nonces, fails.
            for p in [proof, nonce, hello.nonce, [0; 32]] {
                let (v, e) = pending.check(&p).expect_err("a wrong proof passed");
                prop_assert_eq!((v.status, e.errno), (libc::EACCES, libc::EACCES));
                prop_assert!(check_verdict(&v.encode())?.is_some());
            }
        }
    }
    Ok(())
}

fn any_role() -> BoxedStrategy<Role> {
    select(vec![Role::Client, Role::Server, Role::Admin]).boxed()
}

fn any_hello() -> BoxedStrategy<Hello> {
    (
        prop_oneof![
            3 => Just(PROTOCOL_VERSION),
            1 => any::<u16>(),
        ],
        any_role(),
        any::<bool>(),
        any::<[u8; 32]>(),
    )
        .prop_map(|(version, role, has_key, nonce)| Hello {
            version,
            role,
            has_key,
            nonce,
        })
        .boxed()
}

/// Secrets: short, empty, with white space, binary.
fn any_secret() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        select(vec![&b"s"[..], b"pool secret", b"x \n", b"\0"]).prop_map(<[u8]>::to_vec),
        vec(any::<u8>(), 1..40),
    ]
    .boxed()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An honest connector holding `secret` starts a handshake as `role` with
/// a pool of `keys`: its hello, the acceptor's challenge, the acceptor
/// waiting for the proof, and the connector (to compute the proof).
fn honest_exchange(
    role: Role,
    secret: &[u8],
    keys: &Keys,
) -> (Hello, HelloReply, handshake::Pending, Connector) {
    let (c, hb) = Connector::start(role, &Credential::Secret(secret.to_vec())).expect("start");
    let hello = Hello::decode(&hb).expect("own hello");
    let Accept::Challenge(reply, pending) = handshake::accept(&hello, Some(keys)) else {
        panic!("a keyed hello to a keyed pool is challenged");
    };
    (hello, reply, pending, c)
}

// ---------------------------------------------------------------------------
// Tables

/// Every opcode the decoder knows is in [`REQUEST_OPS`] and has a sample
/// strategy; same for response tags. A new message fails here until the
/// fuzz targets cover it.
#[test]
fn opcode_tables_are_complete() {
    let known: BTreeSet<u16> = (0..=u16::MAX)
        .filter(|&o| {
            !matches!(Request::decode(o, Bytes::new()), Err(ProtoError::UnknownOp(x)) if x == o)
        })
        .collect();
    let listed: BTreeSet<u16> = REQUEST_OPS.iter().copied().collect();
    assert_eq!(known, listed, "REQUEST_OPS is not the decoder's opcodes");
    assert_eq!(listed.len(), REQUEST_OPS.len(), "duplicate in REQUEST_OPS");

    let mut runner = TestRunner::deterministic();
    let arms: BTreeSet<u16> = request_arms()
        .into_iter()
        .map(|(o, s)| {
            for _ in 0..8 {
                let r = s.new_tree(&mut runner).expect("sample").current();
                assert_eq!(r.op(), o, "{r:?}");
            }
            o
        })
        .collect();
    assert_eq!(arms, listed, "a request variant has no sample strategy");

    let tags: BTreeSet<u8> = (0..=u8::MAX)
        .filter(|&t| match Response::decode(Bytes::copy_from_slice(&[t])) {
            Err(ProtoError::Malformed(m)) => !m.starts_with("response tag"),
            _ => true,
        })
        .collect();
    assert_eq!(tags, (0..RESPONSE_TAGS).collect::<BTreeSet<u8>>());
    let arms: BTreeSet<u8> = response_arms()
        .into_iter()
        .map(|(t, s)| {
            for _ in 0..8 {
                let r = s.new_tree(&mut runner).expect("sample").current();
                assert_eq!(enc_response(&r)[0], t, "{r:?}");
            }
            t
        })
        .collect();
    assert_eq!(arms, tags, "a response variant has no sample strategy");
}

/// Fixed-size decoders with few inputs: every input.
#[test]
fn small_decoders_exhaustively() {
    for b in 0..=u8::MAX {
        match HelloReply::decode_auth(b) {
            Ok(challenge) => assert_eq!(challenge, b == 1),
            Err(_) => assert!(b > 1),
        }
        match Hashing::from_code(b) {
            Some(h) => assert_eq!(h.code(), b),
            None => assert!(b > 1),
        }
        match Role::from_code(b) {
            Some(r) => assert_eq!(r.code(), b),
            None => assert!(b == 0 || b > 3),
        }
    }
    for n in 0..=u16::MAX {
        let mut f = [0u8; Verdict::FIXED_LEN];
        f[4..6].copy_from_slice(&n.to_le_bytes());
        assert_eq!(Verdict::decode_fixed(&f).is_ok(), n <= 4096);
        let mut f = [0u8; HelloReply::FIXED_LEN];
        f[..8].copy_from_slice(&MAGIC);
        f[14..16].copy_from_slice(&n.to_le_bytes());
        assert_eq!(HelloReply::decode_fixed(&f).is_ok(), n <= 4096);
    }
}

// ---------------------------------------------------------------------------
// Targets: frames

proptest! {
    #![proptest_config(cfg(400))]

    /// `Header::decode` on any 16 bytes.
    #[test]
    fn frame_header(b in any::<[u8; HEADER_LEN]>(), len in huge_len(), big in any::<bool>()) {
        let mut b = b;
        if big {
            b[..4].copy_from_slice(&len.to_le_bytes());
        }
        let claimed = u32_at(&b, 0);
        match Header::decode(&b) {
            Ok(h) => {
                prop_assert!(h.len <= MAX_PAYLOAD);
                prop_assert_eq!(h.encode(), b);
            }
            Err(ProtoError::FrameTooLarge { len, max }) => {
                prop_assert!(claimed > MAX_PAYLOAD);
                prop_assert_eq!((len, max), (u64::from(claimed), u64::from(MAX_PAYLOAD)));
            }
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    /// `CmaRef::split_off` on any payload, and on valid references with
    /// lengths around the limit.
    #[test]
    fn cma_ref(
        junk in junk(),
        head in vec(any::<u8>(), 0..8),
        addr in any::<u64>(),
        len in prop_oneof![Just(u64::from(MAX_PAYLOAD)), Just(u64::from(MAX_PAYLOAD) + 1),
                           Just(u64::MAX), 0u64..1 << 20, any::<u64>()],
        deadline_ns in any::<u64>(),
    ) {
        check_cma(&junk)?;
        let mut p = head.clone();
        p.extend_from_slice(&CmaRef { addr, len, deadline_ns }.encode());
        check_cma(&p)?;
        if let Ok((rest, r)) = CmaRef::split_off(&p) {
            prop_assert_eq!(rest, &head[..]);
            prop_assert_eq!(r, CmaRef { addr, len, deadline_ns });
        } else {
            prop_assert!(len > u64::from(MAX_PAYLOAD));
        }
    }
}

// ---------------------------------------------------------------------------
// Targets: requests

proptest! {
    #![proptest_config(cfg(100))]

    /// Every valid request round-trips.
    #[test]
    fn request_round_trip(req in any_request()) {
        let b = enc_request(&req);
        prop_assert_eq!(Request::decode(req.op(), Bytes::from(b.clone())).ok(), Some(req.clone()));
        check_request(req.op(), &b)?;
    }

    /// `Request::decode` of any bytes under any opcode (known or not).
    #[test]
    fn request_arbitrary(op in any_op(), payload in junk()) {
        check_request(op, &payload)?;
    }

    /// `Request::decode` of mutated valid requests, under their own opcode
    /// and under the other one's.
    #[test]
    fn request_mutated(base in any_request(), other in any_request(), ms in mutations()) {
        let a = enc_request(&base);
        let b = enc_request(&other);
        let m = mutated(&a, &b, &ms);
        check_request(base.op(), &m)?;
        check_request(other.op(), &m)?;
    }

    /// A mutated `FLAG_CMA` write: the reference split off the end, the
    /// rest decoded as a write head.
    #[test]
    fn request_cma_write_mutated(
        base in any_request(),
        r in (any::<u64>(), 0u64..=u64::from(MAX_PAYLOAD) + 1, any::<u64>()),
        ms in mutations(),
    ) {
        let mut p = enc_request(&base);
        p.extend_from_slice(&CmaRef { addr: r.0, len: r.1, deadline_ns: r.2 }.encode());
        let m = mutated(&p, &p, &ms);
        check_cma(&m)?;
        if let Ok((head, _)) = CmaRef::split_off(&m) {
            check_request(op::WRITE, head)?;
        }
    }

    /// A stream of request frames, valid then mutated, or arbitrary.
    #[test]
    fn request_frames(
        reqs in vec((any_request(), any::<u64>(),
                     select(vec![0, FLAG_FORWARDED, FLAG_CMA, FLAG_CMA | FLAG_FORWARDED])), 1..4),
        ms in mutations(),
        junk in junk(),
    ) {
        let mut s = Vec::new();
        for (req, id, flags) in &reqs {
            let mut p = enc_request(req);
            if flags & FLAG_CMA != 0 {
                p.extend_from_slice(&CmaRef { addr: *id, len: 7, deadline_ns: 9 }.encode());
            }
            let h = Header { len: p.len() as u32, id: *id, op: req.op(), flags: *flags };
            s.extend_from_slice(&h.encode());
            s.extend_from_slice(&p);
        }
        check_request_frames(&s)?;
        check_request_frames(&mutated(&s, &junk, &ms))?;
        check_request_frames(&junk)?;
    }
}

// ---------------------------------------------------------------------------
// Targets: responses and errors

proptest! {
    #![proptest_config(cfg(100))]

    /// Every valid response round-trips.
    #[test]
    fn response_round_trip(resp in any_response()) {
        let b = enc_response(&resp);
        prop_assert_eq!(Response::decode(Bytes::from(b.clone())).ok(), Some(resp.clone()));
        check_response(&b)?;
    }

    /// `Response::decode` of any bytes, mostly with a known tag first.
    #[test]
    fn response_arbitrary(tag in prop_oneof![0..RESPONSE_TAGS, any::<u8>()], rest in junk()) {
        let mut p = vec![tag];
        p.extend_from_slice(&rest);
        check_response(&p)?;
        check_response(&rest)?;
    }

    /// `Response::decode` of mutated valid responses.
    #[test]
    fn response_mutated(base in any_response(), other in any_response(), ms in mutations()) {
        let a = enc_response(&base);
        let b = enc_response(&other);
        check_response(&mutated(&a, &b, &ms))?;
    }

    /// `decode_error` of valid, mutated and arbitrary error payloads.
    #[test]
    fn error_reply(e in any_error(), other in any_response(), ms in mutations(), junk in junk()) {
        let a = enc_error(&e);
        prop_assert_eq!(msg::decode_error(Bytes::from(a.clone())).ok(), Some(e.clone()));
        check_error(&a)?;
        check_error(&mutated(&a, &enc_response(&other), &ms))?;
        check_error(&junk)?;
    }

    /// A stream of response frames (results and errors), valid then
    /// mutated, or arbitrary.
    #[test]
    fn response_frames(
        resps in vec((prop_oneof![any_response().prop_map(Ok), any_error().prop_map(Err)],
                      any::<u64>(), any_op()), 1..4),
        ms in mutations(),
        junk in junk(),
    ) {
        let mut s = Vec::new();
        for (resp, id, op) in &resps {
            let (p, flags) = match resp {
                Ok(r) => (enc_response(r), 0),
                Err(e) => (enc_error(e), FLAG_ERROR),
            };
            let h = Header { len: p.len() as u32, id: *id, op: *op, flags };
            s.extend_from_slice(&h.encode());
            s.extend_from_slice(&p);
        }
        check_response_frames(&s)?;
        check_response_frames(&mutated(&s, &junk, &ms))?;
        check_response_frames(&junk)?;
    }
}

// ---------------------------------------------------------------------------
// Targets: the metadata record

proptest! {
    #![proptest_config(cfg(200))]

    /// `Meta::decode` of any bytes and of mutated records: only version 1
    /// is read, and what is read is the first 64 bytes exactly.
    #[test]
    fn meta_record(m in any_meta(), ms in mutations(), junk in junk()) {
        let valid = m.encode();
        prop_assert_eq!(Meta::decode(&valid).ok(), Some(m));
        for b in [mutated(&valid, &junk, &ms), junk.clone()] {
            match Meta::decode(&b) {
                Ok(got) => {
                    prop_assert!(b.len() >= META_LEN);
                    prop_assert_eq!(u16::from_le_bytes([b[0], b[1]]), META_VERSION);
                    prop_assert_eq!(&got.encode()[..], &b[..META_LEN]);
                    let _ = (got.device(), got.epoch(), got.is_dir(), got.is_reg());
                }
                Err(ProtoError::Truncated { needed }) => {
                    prop_assert_eq!(needed + b.len(), META_LEN);
                }
                Err(e) => {
                    prop_assert!(matches!(e, ProtoError::Malformed(_)), "{:?}", e);
                    prop_assert_ne!(u16::from_le_bytes([b[0], b[1]]), META_VERSION);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Targets: the handshake

proptest! {
    #![proptest_config(cfg(200))]

    /// `Hello::decode_head` and `Hello::decode` on any bytes and mutated
    /// hellos; an accepted hello goes through `accept` with and without a
    /// pool secret.
    #[test]
    fn hello(
        h in any_hello(),
        flips in vec((any::<Index>(), 1u8..=255), 0..3),
        raw in vec(any::<u8>(), Hello::LEN),
        magic in any::<bool>(),
        secret in option::of(any_secret()),
    ) {
        let keys = secret.as_deref().map(Keys::from_secret);
        let mut m = h.encode();
        for (i, mask) in &flips {
            m[i.index(Hello::LEN)] ^= mask;
        }
        let mut raw: [u8; Hello::LEN] = raw.try_into().expect("hello length");
        if magic {
            raw[..8].copy_from_slice(&MAGIC);
        }
        for b in [h.encode(), m, raw] {
            let head = Hello::decode_head(b[..Hello::HEAD_LEN].try_into().expect("head"));
            match Hello::decode(&b) {
                Ok(got) => {
                    prop_assert_eq!(head.ok(), Some(got.version));
                    prop_assert_eq!(got.encode(), b);
                    check_accept(&got, keys.as_ref())?;
                    check_accept(&got, None)?;
                }
                Err(ProtoError::BadMagic) => {
                    prop_assert!(b[..8] != MAGIC);
                    prop_assert!(matches!(head, Err(ProtoError::BadMagic)));
                }
                Err(e) => {
                    prop_assert!(matches!(e, ProtoError::Malformed(_)), "{:?}", e);
                    prop_assert!(b[10] == 0 || b[10] > 3 || b[11] > 1);
                }
            }
        }
        prop_assert_eq!(Hello::decode(&h.encode()).ok(), Some(h));
    }

    /// `HelloReply::decode_fixed`, `decode_auth`, `decode_challenge` as a
    /// connector reads a reply: valid replies, mutated, arbitrary.
    #[test]
    fn hello_reply(
        version in any::<u16>(),
        status in prop_oneof![Just(0), any::<i32>()],
        message in text(),
        challenge in option::of((any::<[u8; 32]>(), any::<[u8; 32]>())),
        ms in mutations(),
        junk in junk(),
        magic in any::<bool>(),
    ) {
        let reply = HelloReply {
            version,
            status,
            message: if status == 0 { String::new() } else { message },
            auth: match challenge {
                Some((nonce, proof)) if status == 0 => Auth::Challenge { nonce, proof },
                _ => Auth::Open,
            },
        };
        let valid = reply.encode();
        prop_assert_eq!(check_hello_reply(&valid)?, Some(reply));
        check_hello_reply(&mutated(&valid, &junk, &ms))?;
        let mut j = junk.clone();
        if magic {
            j.splice(0..0, MAGIC);
        }
        check_hello_reply(&j)?;
    }

    /// `Verdict::decode_fixed` and the message: valid, mutated, arbitrary.
    #[test]
    fn verdict(status in any::<i32>(), message in text(), ms in mutations(), junk in junk()) {
        let v = Verdict { status, message };
        let valid = v.encode();
        prop_assert_eq!(check_verdict(&valid)?, Some(v));
        check_verdict(&mutated(&valid, &junk, &ms))?;
        check_verdict(&junk)?;
    }

}

proptest! {
    // Every case derives keys (HKDF) a dozen times.
    #![proptest_config(cfg(60))]

    /// `Credential::parse` of any text: empty is none; `chfs-client-key:`
    /// and exactly 64 hex digits is that key; anything else with the
    /// prefix is refused; anything else is the secret itself.
    #[test]
    fn credential(
        junk in junk(),
        digits in vec(select(b"0123456789abcdefABCDEF".to_vec()), 64),
        corrupt in vec((any::<Index>(), select(b"+- xg\xc3\xa9\0A0".to_vec())), 0..3),
        resize in prop_oneof![4 => Just(0i8), 1 => -2i8..=2],
        pad in select(vec!["", " ", "\n", "\t \r\n"]),
        secret in any_secret(),
    ) {
        // 64 hex digits, a few perhaps replaced, one or two perhaps added
        // or removed.
        let mut digits = digits;
        for (i, b) in &corrupt {
            let at = i.index(digits.len());
            digits[at] = *b;
        }
        match resize {
            r if r < 0 => digits.truncate(digits.len() - r.unsigned_abs() as usize),
            r => digits.extend(std::iter::repeat_n(b'a', r as usize)),
        }
        let mut keyfile = CLIENT_KEY_PREFIX.as_bytes().to_vec();
        keyfile.extend_from_slice(pad.as_bytes());
        keyfile.extend_from_slice(&digits);
        keyfile.extend_from_slice(pad.as_bytes());
        let mut prefixed = CLIENT_KEY_PREFIX.as_bytes().to_vec();
        prefixed.extend_from_slice(&junk);
        for text in [&junk[..], &keyfile[..], &prefixed[..]] {
            let t = text.trim_ascii_end();
            match Credential::parse(text) {
                Ok(Credential::None) => prop_assert!(t.is_empty()),
                Ok(Credential::Secret(s)) => {
                    prop_assert_eq!(&s[..], t);
                    prop_assert!(!t.starts_with(CLIENT_KEY_PREFIX.as_bytes()));
                }
                Ok(Credential::ClientKey(k)) => {
                    let h = t
                        .strip_prefix(CLIENT_KEY_PREFIX.as_bytes())
                        .expect("a key without the prefix")
                        .trim_ascii();
                    prop_assert!(h.len() == 64 && h.iter().all(u8::is_ascii_hexdigit),
                                 "accepted key digits {:?}", String::from_utf8_lossy(h));
                    prop_assert_eq!(hex(&k), String::from_utf8_lossy(h).to_ascii_lowercase());
                }
                Err(e) => {
                    prop_assert!(t.starts_with(CLIENT_KEY_PREFIX.as_bytes()), "{:?}", e);
                }
            }
            // Whatever was parsed, starting a handshake with it works or
            // says why not (a client key for another role).
            if let Ok(cred) = Credential::parse(text) {
                for role in [Role::Client, Role::Server, Role::Admin] {
                    match Connector::start(role, &cred) {
                        Ok((_, hello)) => {
                            let h = Hello::decode(&hello).expect("own hello");
                            prop_assert_eq!((h.role, h.has_key), (role, cred.is_some()));
                        }
                        Err(e) => {
                            prop_assert!(matches!(cred, Credential::ClientKey(_)));
                            prop_assert_ne!(role, Role::Client);
                            prop_assert_eq!(e.errno, libc::EPERM);
                        }
                    }
                }
            }
        }
        // A client key file reads back as the pool's client key, in any
        // case.
        let keys = Keys::from_secret(&secret);
        let file = Credential::client_key_file(&secret);
        let upper = file
            .to_ascii_uppercase()
            .replacen("CHFS-CLIENT-KEY:", CLIENT_KEY_PREFIX, 1);
        for f in [file.clone(), upper] {
            match Credential::parse(f.as_bytes()) {
                Ok(Credential::ClientKey(k)) => prop_assert_eq!(&k, keys.get(Role::Client)),
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }
}

proptest! {
    #![proptest_config(cfg(50))]

    /// The whole acceptance path with real keys: the exact proof passes,
    /// every other proof (mutated, arbitrary, replayed from another
    /// connection, made with another secret) is refused; a connector
    /// accepts only the acceptor's exact reply.
    #[test]
    fn handshake_proofs(
        role in any_role(),
        secret in any_secret(),
        wrong in any_secret(),
        flips in vec((any::<Index>(), 1u8..=255), 1..4),
        arbitrary in any::<[u8; 32]>(),
        reply_ms in mutations(),
    ) {
        let keys = Keys::from_secret(&secret);
        let (hello, reply, pending, c) = honest_exchange(role, &secret, &keys);
        prop_assert!(hello.has_key);
        check_accept(&hello, Some(&keys))?;
        let wire = reply.encode();
        let got = check_hello_reply(&wire)?.expect("whole reply");
        prop_assert_eq!(&got, &reply);
        let proof = c
            .on_reply(got.version, got.status, &got.message, &got.auth)
            .expect("honest reply")
            .expect("a proof");
        // Only the exact proof passes.
        let mut bad = proof;
        for (i, mask) in &flips {
            bad[i.index(32)] ^= mask;
        }
        for p in [bad, arbitrary] {
            if p != proof {
                let (v, e) = pending.check(&p).expect_err("a wrong proof passed");
                prop_assert_eq!((v.status, e.errno), (libc::EACCES, libc::EACCES));
            }
        }
        // The proof is worthless on another connection (the same hello
        // replayed gets a new challenge).
        let Accept::Challenge(_, again) = handshake::accept(&hello, Some(&keys)) else {
            return Err(TestCaseError::fail("not challenged"));
        };
        prop_assert!(again.check(&proof).is_err());
        prop_assert_eq!(pending.check(&proof).ok(), Some(role));
        // A reply changed on the way: the connector goes on only if it is
        // the exact reply.
        let m = mutated(&wire, &wire, &reply_ms);
        if let Ok(Some((r, _, _))) = read_hello_reply(&m) {
            let outcome = c.on_reply(r.version, r.status, &r.message, &r.auth);
            if r.status != 0 || r.version != PROTOCOL_VERSION || r.auth != reply.auth {
                prop_assert!(outcome.is_err(), "connector accepted {:?}", r);
            } else {
                prop_assert_eq!(outcome.ok(), Some(Some(proof)));
            }
        }
        // A connector with another secret refuses the acceptor's challenge
        // (and so never sends a proof).
        if wrong != secret {
            let (c2, hb) =
                Connector::start(role, &Credential::Secret(wrong.clone())).expect("start");
            let h2 = Hello::decode(&hb).expect("own hello");
            let Accept::Challenge(r2, p2) = handshake::accept(&h2, Some(&keys)) else {
                return Err(TestCaseError::fail("not challenged"));
            };
            let e = c2.on_reply(r2.version, r2.status, &r2.message, &r2.auth).err();
            prop_assert_eq!(e.map(|e| e.errno), Some(libc::EACCES));
            // Nor does a proof from another connection pass there.
            prop_assert!(p2.check(&proof).is_err());
        }
        // A hello whose role was changed on the way: the acceptor's proof
        // no longer matches what the connector asked for.
        let mut hb = hello.encode();
        hb[10] = match role { Role::Client => 2, Role::Server => 3, Role::Admin => 1 };
        let swapped = Hello::decode(&hb).expect("valid role");
        if let Accept::Challenge(r3, p3) = handshake::accept(&swapped, Some(&keys)) {
            prop_assert!(c.on_reply(r3.version, r3.status, &r3.message, &r3.auth).is_err());
            prop_assert!(p3.check(&proof).is_err());
        }
    }
}

// ---------------------------------------------------------------------------
// Targets: paths

/// Path-like strings: components that matter to the rules.
fn path_like() -> BoxedStrategy<String> {
    let comp = prop_oneof![
        4 => select(vec!["", ".", "..", "a", "bc", "é", "a\0", "...", " "]).prop_map(String::from),
        1 => select(vec![MAX_NAME - 1, MAX_NAME, MAX_NAME + 1]).prop_map(|n| "n".repeat(n)),
        1 => vec(any::<char>(), 0..6).prop_map(String::from_iter),
    ];
    (any::<bool>(), vec(comp, 0..8), any::<bool>())
        .prop_map(|(lead, comps, trail)| {
            let mut s = if lead { "/".to_string() } else { String::new() };
            s.push_str(&comps.join("/"));
            if trail {
                s.push('/');
            }
            s
        })
        .boxed()
}

/// Paths near the length limit, absolute or not.
fn long_path() -> BoxedStrategy<String> {
    (
        any::<bool>(),
        MAX_PATH - 8..=MAX_PATH + 2,
        1usize..=MAX_NAME,
        any::<bool>(),
    )
        .prop_map(|(lead, total, comp, dots)| {
            let mut s = if lead { "/".to_string() } else { String::new() };
            let mut k = 0;
            while s.len() < total {
                if !s.is_empty() && !s.ends_with('/') {
                    s.push('/');
                }
                if dots && k % 5 == 4 {
                    s.push_str("..");
                } else {
                    let room = total.saturating_sub(s.len()).clamp(1, comp);
                    s.push_str(&"p".repeat(room));
                }
                k += 1;
            }
            s
        })
        .boxed()
}

proptest! {
    #![proptest_config(cfg(300))]

    /// `validate` (paths received from peers) and `normalize` on any
    /// string: a normalised path is valid and a fixed point; a valid path
    /// is its own normal form; parents, names and joins stay valid.
    #[test]
    fn paths(p in prop_oneof![3 => path_like(), 1 => long_path(),
                              1 => vec(any::<char>(), 0..40).prop_map(String::from_iter)]) {
        match path::validate(&p) {
            Ok(()) => {
                prop_assert!(p.len() <= MAX_PATH);
                prop_assert_eq!(path::normalize(&p).ok(), Some(p.clone()));
                let parent = path::parent(&p);
                let name = path::file_name(&p);
                prop_assert!(path::validate(parent).is_ok());
                prop_assert!(path::is_within(&p, parent));
                prop_assert!(path::is_within(&p, "/"));
                if p != "/" {
                    prop_assert!(!name.is_empty() && !name.contains('/'));
                    prop_assert_eq!(path::join(parent, name), p.clone());
                    prop_assert!(!path::is_within(parent, &p));
                }
            }
            Err(e) => prop_assert!(
                e.errno == libc::EINVAL || e.errno == libc::ENAMETOOLONG, "{:?}", e),
        }
        match path::normalize(&p) {
            Ok(n) => {
                prop_assert!(path::validate(&n).is_ok(),
                             "normalize({:?}) = {:?} is not valid: {:?}", p, n, path::validate(&n));
                prop_assert_eq!(path::normalize(&n).ok(), Some(n.clone()));
            }
            Err(e) => prop_assert!(
                [libc::ENOENT, libc::EINVAL, libc::ENAMETOOLONG].contains(&e.errno), "{:?}", e),
        }
    }

    /// `Hashing::from_str` (command lines, configuration) on any text.
    #[test]
    fn hashing_names(
        s in prop_oneof![Just("modular".to_string()), Just("consistent".to_string()), text()],
    ) {
        if let Ok(h) = s.parse::<Hashing>() {
            prop_assert!(s == "modular" || s == "consistent");
            prop_assert_eq!(h == Hashing::Consistent, s == "consistent");
        }
    }
}

// ---------------------------------------------------------------------------
// Regressions: inputs the targets above found (minimised), as literal bytes.

/// `Response::Entries` with a count of 4 G and no entries: the decoder
/// reserved room for 4096 entries (360 KB) for a 6-byte payload. Found by
/// `response_mutated` and `response_frames`.
#[test]
fn regression_entries_count_reserves_only_what_fits() {
    for payload in [
        &[7u8, 0, 0xff, 0xff, 0xff, 0xff][..],
        &[7, 1, 0x00, 0x10, 0x00, 0x00, 0x00],
        &[7, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0],
    ] {
        let input = Bytes::copy_from_slice(payload);
        let (res, used) = metered(|| Response::decode(input));
        assert!(matches!(res, Err(ProtoError::Truncated { .. })), "{res:?}");
        assert!(used <= budget(payload.len()), "allocated {used} bytes");
    }
}

/// A server list claiming 2^20 servers (the most allowed) with none
/// there: the decoder reserved room for 1024 of them. Found by
/// `request_mutated` (UPDATE_SERVERS); responses read the list the same way.
#[test]
fn regression_server_count_reserves_only_what_fits() {
    #[rustfmt::skip]
    let list: &[u8] = &[
        0, 0, 0, 0, 0, 0, 0, 0, // version
        1,                      // hashing
        0x00, 0x00, 0x01, 0x00, // 2^16 servers (the most a list may have)
        0, 0, 0, 0,             // the first one's address: empty
    ];
    let input = Bytes::copy_from_slice(list);
    let (res, used) = metered(|| Request::decode(op::UPDATE_SERVERS, input));
    assert!(matches!(res, Err(ProtoError::Truncated { .. })), "{res:?}");
    assert!(used <= budget(list.len()), "allocated {used} bytes");
    let mut resp = vec![1u8];
    resp.extend_from_slice(list);
    let input = Bytes::copy_from_slice(&resp);
    let (res, used) = metered(|| Response::decode(input));
    assert!(matches!(res, Err(ProtoError::Truncated { .. })), "{res:?}");
    assert!(used <= budget(resp.len()), "allocated {used} bytes");
    // One more is refused before anything is read: a ring built from it
    // would be as large as the count says.
    let mut more = list.to_vec();
    more[9..13].copy_from_slice(&(chfs_proto::ring::MAX_SERVERS as u32 + 1).to_le_bytes());
    let res = Request::decode(op::UPDATE_SERVERS, Bytes::from(more));
    assert!(matches!(res, Err(ProtoError::Malformed(_))), "{res:?}");
}

/// A client key with a sign among its digits was read as a key
/// (`u8::from_str_radix("+0", 16)` is 0): a file that is not a client key
/// was taken for one. Found by `credential`.
#[test]
fn regression_client_key_digits_are_hex_only() {
    for text in [
        &b"chfs-client-key:000000000000+000000000000000000000000000000000000000000000000000"[..],
        b"chfs-client-key:+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0+0\n",
    ] {
        assert!(
            Credential::parse(text).is_err(),
            "{:?}",
            String::from_utf8_lossy(text)
        );
    }
    let ok = b"chfs-client-key:000000000000F000000000000000000000000000000000000000000000000000";
    assert!(matches!(Credential::parse(ok), Ok(Credential::ClientKey(k)) if k[6] == 0xf0));
}

/// A relative path of exactly `MAX_PATH` bytes normalised to `MAX_PATH + 1`
/// bytes (the leading '/'), which `validate` refuses: `normalize` must not
/// return a path no server accepts. Found by `paths`.
#[test]
fn regression_normalize_never_exceeds_max_path() {
    let p = format!("{}p", "pppp/".repeat(819));
    assert_eq!(p.len(), MAX_PATH);
    assert_eq!(path::normalize(&p).unwrap_err().errno, libc::ENAMETOOLONG);
    let shorter = &p[1..];
    let n = path::normalize(shorter).unwrap();
    assert_eq!(n.len(), MAX_PATH);
    assert!(path::validate(&n).is_ok());
}
