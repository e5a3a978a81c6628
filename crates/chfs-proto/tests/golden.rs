//! Golden bytes of everything two chfs-rs processes must agree on: the
//! frame header, every request and response payload, the error reply, the
//! 64-byte metadata record, the handshake messages and keys, the server
//! list and the placement of chunks on servers (path hash, modular and
//! consistent hashing).
//!
//! Each expected encoding is written below as hex, one piece per field, so
//! a change of layout, field order, width, endianness or hashing fails here
//! with a field-by-field diff (the bytes produced are printed grouped as
//! the expected pieces). A deliberate format change updates these literals
//! *and* bumps [`PROTOCOL_VERSION`] (pinned in [`protocol_constants`]).
//!
//! Already pinned elsewhere, not repeated here: the payloads of
//! `Request::Read` and `Request::Write` (`msg.rs`,
//! `golden_read_and_write_requests`; here only their opcodes, round trip
//! and the client's zero-copy write head), and the hello of version 5 with
//! the first 8 bytes of the client key (`handshake.rs`,
//! `golden_hello_and_credentials`).

use std::collections::BTreeSet;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use chfs_proto::frame::{
    CmaRef, Header, FLAG_CMA, FLAG_ERROR, FLAG_FORWARDED, FLAG_LAND, HEADER_LEN, MAX_PAYLOAD,
};
use chfs_proto::handshake::{
    accept, accepted, version_refusal, Accept, Auth, Credential, Hello, HelloReply, Keys, Role,
    Verdict, CLIENT_KEY_PREFIX, MAGIC, NONCE_LEN,
};
use chfs_proto::meta::{self, Meta, META_LEN, META_VERSION};
use chfs_proto::msg::{
    self, encode_error, encode_write_head, op, rw, DirEntry, FlushState, RebalanceState,
    RemoveKind, ServerStatus, SetAttr, TimeSet, TreePage, WriteHead,
};
use chfs_proto::ring::{path_hash, Hashing, Ring, ServerList};
use chfs_proto::{ErrorReply, Request, Response, PROTOCOL_VERSION};

// ---------------------------------------------------------------------------
// Comparing against hex

/// Lower-case hex of `b`, no separators.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The expected hex: the pieces joined, white space dropped.
fn joined(want: &[&str]) -> String {
    want.iter()
        .flat_map(|p| p.chars())
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// `got` as hex, cut where the expected pieces are cut, each line the
/// expected piece and the bytes produced in its place, so a wrong field
/// stands out in the report.
fn grouped_like(got: &str, want: &[&str]) -> String {
    let mut out = Vec::new();
    let mut rest = got;
    for p in want {
        let w: String = p.chars().filter(|c| !c.is_whitespace()).collect();
        let n = w.len().min(rest.len());
        let mark = if rest[..n] == w { "" } else { "   <-- differs" };
        out.push(format!("want {w:<20} got {}{mark}", &rest[..n]));
        rest = &rest[n..];
    }
    if !rest.is_empty() {
        out.push(format!("past the expected end: {rest}"));
    }
    out.join("\n    ")
}

/// Collects the mismatches of one test and reports them all at once.
#[derive(Default)]
struct Golden {
    failures: Vec<String>,
}

impl Golden {
    /// Checks that `got` is exactly the hex `want` (pieces concatenated,
    /// white space ignored).
    fn bytes(&mut self, name: &str, got: &[u8], want: &[&str]) {
        let (got, w) = (hex(got), joined(want));
        if got != w {
            self.failures.push(format!(
                "{name}:\n  want {}\n  got  {}\n  field by field:\n    {}",
                w,
                got,
                grouped_like(&got, want)
            ));
        }
    }

    /// Checks a value that is not bytes (a hash, an owner list).
    fn value<T: std::fmt::Debug + PartialEq>(&mut self, name: &str, got: T, want: T) {
        if got != want {
            self.failures
                .push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }

    /// Panics with every mismatch found.
    fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} golden value(s) changed (a format change must update them and bump \
                 PROTOCOL_VERSION):\n\n{}",
                self.failures.len(),
                self.failures.join("\n\n")
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Fixed inputs

/// A metadata record with every field distinct (and every byte of a field
/// distinct where the width allows), so a swapped or resized field shows.
const META: Meta = Meta {
    flags: meta::FLAG_DIRTY | meta::FLAG_STRAY, // 0x0081
    mode: 0o100644,                             // 0x000081a4
    uid: 0x1314_1516,
    gid: 0x2324_2526,
    size: 0x3132_3334_3536_3738,
    chunk_size: 0x0001_0000, // 64 KiB
    rdev: 0x4344_4546,       // the epoch of a regular file
    mtime: 0x5152_5354_5556_5758,
    ctime: 0x6162_6364_6566_6768,
    atime: -2, // before the epoch: two's complement
    fileid: 0x7374_7576,
    crc: 0x8384_8586,
};

/// [`META`] encoded, one piece per field (offsets as in `meta.rs`).
const META_HEX: [&str; 13] = [
    "0100",             // 0  version u16 (META_VERSION)
    "8100",             // 2  flags u16
    "a4810000",         // 4  mode u32
    "16151413",         // 8  uid u32
    "26252423",         // 12 gid u32
    "3837363534333231", // 16 size u64
    "00000100",         // 24 chunk_size u32
    "46454443",         // 28 rdev u32
    "5857565554535251", // 32 mtime i64
    "6867666564636261", // 40 ctime i64
    "feffffffffffffff", // 48 atime i64
    "76757473",         // 56 fileid u32
    "86858483",         // 60 crc u32
];

/// [`DIR_META`] encoded.
const DIR_META_HEX: [&str; 13] = [
    "0100",             // version
    "0000",             // flags
    "ed410000",         // mode 0o40755
    "e8030000",         // uid 1000
    "64000000",         // gid 100
    "0000000000000000", // size
    "00100000",         // chunk_size 4096
    "00000000",         // rdev
    "00002a36fe9c9717", // mtime 1_700_000_000_000_000_000
    "01002a36fe9c9717", // ctime
    "02002a36fe9c9717", // atime
    "09000000",         // fileid
    "00000000",         // crc
];

/// A second, plain record (a directory), for lists of entries.
const DIR_META: Meta = Meta {
    flags: 0,
    mode: 0o40755,
    uid: 1000,
    gid: 100,
    size: 0,
    chunk_size: 4096,
    rdev: 0,
    mtime: 1_700_000_000_000_000_000,
    ctime: 1_700_000_000_000_000_001,
    atime: 1_700_000_000_000_000_002,
    fileid: 9,
    crc: 0,
};

/// Pieces joined with [`META_HEX`] in the middle.
fn with_meta<'a>(head: &[&'a str], meta_hex: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(meta_hex).chain(tail).copied().collect()
}

// ---------------------------------------------------------------------------
// Constants

#[test]
fn protocol_constants() {
    // A bump of the version is a deliberate edit of this line, made with
    // the literals below that changed.
    assert_eq!(PROTOCOL_VERSION, 13);
    assert_eq!(MAGIC, *b"CHFS-RS\x01");
    assert_eq!(HEADER_LEN, 16);
    assert_eq!(META_LEN, 64);
    assert_eq!(META_VERSION, 1);
    assert_eq!(NONCE_LEN, 32);
    assert_eq!(chfs_proto::MAX_CHUNK_SIZE, 64 << 20);
    assert_eq!(MAX_PAYLOAD, (64 << 20) + (64 << 10));
    assert_eq!(chfs_proto::DEFAULT_CHUNK_SIZE, 64 << 10);
    assert_eq!(chfs_proto::DEFAULT_PORT, 50000);
    assert_eq!(chfs_proto::ring::MAX_SERVERS, 65536);
    assert_eq!(CmaRef::LEN, 24);
    assert_eq!(
        (FLAG_ERROR, FLAG_FORWARDED, FLAG_CMA, FLAG_LAND),
        (1, 2, 4, 8)
    );
    assert_eq!(
        [
            meta::FLAG_DIRTY,
            meta::FLAG_CACHED,
            meta::FLAG_PARTIAL,
            meta::FLAG_WHITEOUT,
            meta::FLAG_BACKEND_ONLY,
            meta::FLAG_MODIFIED,
            meta::FLAG_DAMAGED,
            meta::FLAG_STRAY,
        ],
        [1, 2, 4, 8, 16, 32, 64, 128]
    );
    assert_eq!(
        [rw::BACKEND, rw::FETCH_ONLY, rw::MODIFIED, rw::DAMAGED],
        [1, 2, 4, 8]
    );
    assert_eq!(
        [Role::Client.code(), Role::Server.code(), Role::Admin.code()],
        [1, 2, 3]
    );
    assert_eq!(
        [Hashing::Modular.code(), Hashing::Consistent.code()],
        [0, 1]
    );
    assert_eq!(chfs_proto::local_socket_name("h:1"), "chfsd@h:1");
}

// ---------------------------------------------------------------------------
// Frame

#[test]
fn frame_header() {
    let mut g = Golden::default();
    let h = Header {
        len: 0x0102_0304,
        id: 0x1112_1314_1516_1718,
        op: op::PUT_CHUNK,
        flags: FLAG_FORWARDED | FLAG_CMA,
    };
    g.bytes(
        "frame header",
        &h.encode(),
        &[
            "04030201",         // len u32
            "1817161514131211", // id u64
            "1600",             // op u16 (PUT_CHUNK, 22)
            "0600",             // flags u16 (FORWARDED | CMA)
        ],
    );
    assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    // An error response: FLAG_ERROR, the request's id and opcode echoed.
    let e = Header {
        len: 0,
        id: 1,
        op: op::STAT,
        flags: FLAG_ERROR,
    };
    g.bytes(
        "error response header",
        &e.encode(),
        &["00000000", "0100000000000000", "0b00", "0100"],
    );
    let r = CmaRef {
        addr: 0x0000_7f01_0203_0400,
        len: 0x1_0000,
        deadline_ns: 0x2122_2324_2526_2728,
    };
    g.bytes(
        "CmaRef",
        &r.encode(),
        &[
            "00040302017f0000", // addr u64
            "0000010000000000", // len u64
            "2827262524232221", // deadline_ns u64
        ],
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// Metadata record

#[test]
fn meta_record() {
    let mut g = Golden::default();
    g.bytes("Meta", &META.encode(), &META_HEX);
    assert_eq!(Meta::decode(&META.encode()).unwrap(), META);
    // Even an all-zero record carries its version.
    g.bytes(
        "Meta::default()",
        &Meta::default().encode(),
        &["0100", &"00".repeat(62)],
    );
    g.bytes("directory Meta", &DIR_META.encode(), &DIR_META_HEX);
    g.finish();
}

// ---------------------------------------------------------------------------
// Requests

/// Every request variant, by name. A new variant fails to compile here;
/// add it to [`REQUEST_VARIANTS`] and a golden case to [`requests`].
fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Ping => "Ping",
        Request::GetServers => "GetServers",
        Request::Join { .. } => "Join",
        Request::UpdateServers { .. } => "UpdateServers",
        Request::Status => "Status",
        Request::Shutdown => "Shutdown",
        Request::Create { .. } => "Create",
        Request::Stat { .. } => "Stat",
        Request::Write { .. } => "Write",
        Request::Read { .. } => "Read",
        Request::SetSize { .. } => "SetSize",
        Request::SetAttr { .. } => "SetAttr",
        Request::RemoveEntry { .. } => "RemoveEntry",
        Request::RemoveChunks { .. } => "RemoveChunks",
        Request::TruncateChunks { .. } => "TruncateChunks",
        Request::Readdir { .. } => "Readdir",
        Request::ReaddirDirs { .. } => "ReaddirDirs",
        Request::HasChildren { .. } => "HasChildren",
        Request::RenameMove { .. } => "RenameMove",
        Request::PutChunk { .. } => "PutChunk",
        Request::AppendReserve { .. } => "AppendReserve",
        Request::FlushStatus { .. } => "FlushStatus",
        Request::Flush { .. } => "Flush",
        Request::Sync => "Sync",
        Request::Rebalance { .. } => "Rebalance",
        Request::AdoptChunk { .. } => "AdoptChunk",
        Request::Lane { .. } => "Lane",
        Request::ShmAttach { .. } => "ShmAttach",
        Request::Lookup { .. } => "Lookup",
        Request::WatchStat { .. } => "WatchStat",
        Request::Invalidate { .. } => "Invalidate",
        Request::NodeLocal { .. } => "NodeLocal",
        Request::ListTree { .. } => "ListTree",
        Request::DirVersion { .. } => "DirVersion",
        Request::ReadSpans { .. } => "ReadSpans",
        Request::StatData { .. } => "StatData",
        Request::WriteSpans { .. } => "WriteSpans",
        Request::ReadSpansPlaced { .. } => "ReadSpansPlaced",
    }
}

const REQUEST_VARIANTS: [&str; 38] = [
    "Ping",
    "GetServers",
    "Join",
    "UpdateServers",
    "Status",
    "Shutdown",
    "Create",
    "Stat",
    "Write",
    "Read",
    "SetSize",
    "SetAttr",
    "RemoveEntry",
    "RemoveChunks",
    "TruncateChunks",
    "Readdir",
    "ReaddirDirs",
    "HasChildren",
    "RenameMove",
    "PutChunk",
    "AppendReserve",
    "FlushStatus",
    "Flush",
    "Sync",
    "Rebalance",
    "AdoptChunk",
    "Lane",
    "ShmAttach",
    "Lookup",
    "WatchStat",
    "Invalidate",
    "NodeLocal",
    "ListTree",
    "DirVersion",
    "ReadSpans",
    "StatData",
    "WriteSpans",
    "ReadSpansPlaced",
];

/// A list of three servers, the second one replaced at version 5.
fn three_servers() -> ServerList {
    ServerList {
        version: 0x0102_0304_0506_0708,
        hashing: Hashing::Consistent,
        servers: vec!["a:1".into(), "bb:22".into(), "c:3".into()],
        since: vec![0, 5, 0],
    }
}

/// [`three_servers`] encoded.
const THREE_SERVERS_HEX: [&str; 9] = [
    "0807060504030201",    // version u64
    "01",                  // hashing (consistent)
    "03000000",            // count u32
    "03000000 613a31",     // "a:1"
    "0000000000000000",    // its since
    "05000000 62623a3232", // "bb:22"
    "0500000000000000",    // its since
    "03000000 633a33",     // "c:3"
    "0000000000000000",    // its since
];
#[test]
fn requests() {
    let mut g = Golden::default();
    let mut seen = BTreeSet::new();
    // (request, its opcode as a number, the payload's pieces; None: the
    // payload is pinned in msg.rs)
    let cases: Vec<(Request, u16, Option<Vec<&str>>)> = vec![
        (Request::Ping, 1, Some(vec![])),
        (Request::GetServers, 2, Some(vec![])),
        (
            Request::Join {
                addr: "host:1".into(),
                fresh: true,
            },
            3,
            Some(vec![
                "06000000 686f73743a31", // addr: u32 length, bytes
                "01",                    // fresh
            ]),
        ),
        (
            Request::UpdateServers {
                list: three_servers(),
            },
            4,
            Some(THREE_SERVERS_HEX.to_vec()),
        ),
        (Request::Status, 5, Some(vec![])),
        (Request::Shutdown, 6, Some(vec![])),
        (
            Request::Create {
                path: "/f".into(),
                meta: META,
                excl: true,
                data: Bytes::from_static(b"tgt"),
            },
            10,
            Some(with_meta(
                &["02000000 2f66"], // path
                &META_HEX,
                &[
                    "01",     // excl
                    "746774", // data (payload tail)
                ],
            )),
        ),
        (
            Request::Stat {
                path: "/d/e".into(),
            },
            11,
            Some(vec!["04000000 2f642f65"]),
        ),
        (
            Request::Write {
                path: "/x".into(),
                fileid: 1,
                chunk_size: 2,
                mode: 0o100644,
                idx: 3,
                off: 4,
                flags: rw::MODIFIED,
                epoch: 5,
                data: Bytes::from_static(b"zz"),
            },
            12,
            None,
        ),
        (
            Request::Read {
                path: "/ab".into(),
                fileid: 1,
                idx: 2,
                off: 3,
                len: 4,
                chunk_size: 5,
                flags: rw::DAMAGED,
                epoch: 6,
            },
            13,
            None,
        ),
        (
            Request::SetSize {
                path: "/f".into(),
                size: 0x0102_0304_0506_0708,
                grow_only: true,
                if_size: None,
                stray: false,
            },
            14,
            Some(vec![
                "02000000 2f66",    // path
                "0807060504030201", // size
                "01",               // grow_only
                "00",               // stray
                "00",               // if_size: none
            ]),
        ),
        (
            Request::SetSize {
                path: "/f".into(),
                size: 7,
                grow_only: false,
                if_size: Some(0x1112_1314_1516_1718),
                stray: true,
            },
            14,
            Some(vec![
                "02000000 2f66",       // path
                "0700000000000000",    // size
                "00",                  // grow_only
                "01",                  // stray
                "01 1817161514131211", // if_size: some, u64
            ]),
        ),
        (
            Request::SetAttr {
                path: "/f".into(),
                attr: SetAttr {
                    mode: Some(0o600),
                    uid: None,
                    gid: Some(0x0102_0304),
                    atime: TimeSet::Now,
                    mtime: TimeSet::At(-5),
                },
            },
            15,
            Some(vec![
                "02000000 2f66",       // path
                "01 80010000",         // mode: some
                "00",                  // uid: none
                "01 04030201",         // gid: some
                "01",                  // atime: now
                "02 fbffffffffffffff", // mtime: at -5
            ]),
        ),
        (
            Request::SetAttr {
                path: "/f".into(),
                attr: SetAttr {
                    mode: None,
                    uid: Some(7),
                    gid: None,
                    atime: TimeSet::At(0x0102_0304_0506_0708),
                    mtime: TimeSet::Omit,
                },
            },
            15,
            Some(vec![
                "02000000 2f66",       // path
                "00",                  // mode: none
                "01 07000000",         // uid: some
                "00",                  // gid: none
                "02 0807060504030201", // atime: at
                "00",                  // mtime: omit
            ]),
        ),
        (
            Request::RemoveEntry {
                path: "/f".into(),
                kind: RemoveKind::NotDir,
            },
            16,
            Some(vec!["02000000 2f66", "00"]),
        ),
        (
            Request::RemoveEntry {
                path: "/d".into(),
                kind: RemoveKind::Dir,
            },
            16,
            Some(vec!["02000000 2f64", "01"]),
        ),
        (
            Request::RemoveChunks {
                path: "/f".into(),
                from_idx: 0x0102_0304_0506_0708,
            },
            17,
            Some(vec!["02000000 2f66", "0807060504030201"]),
        ),
        (
            Request::TruncateChunks {
                path: "/f".into(),
                size: 0x0102_0304_0506_0708,
                chunk_size: 0x1112_1314,
            },
            18,
            Some(vec![
                "02000000 2f66",    // path
                "0807060504030201", // size
                "14131211",         // chunk_size
            ]),
        ),
        (
            Request::Readdir {
                path: "/d".into(),
                after: "x".into(),
                max: 0x0102_0304,
            },
            19,
            Some(vec![
                "02000000 2f64", // path
                "01000000 78",   // after
                "04030201",      // max
            ]),
        ),
        (
            Request::ReaddirDirs {
                path: "/d".into(),
                after: "".into(),
                max: 7,
            },
            27,
            Some(vec!["02000000 2f64", "00000000", "07000000"]),
        ),
        (
            Request::HasChildren { path: "/d".into() },
            20,
            Some(vec!["02000000 2f64"]),
        ),
        (
            Request::RenameMove {
                old: "/a".into(),
                new: "/bc".into(),
                is_dir: true,
            },
            21,
            Some(vec![
                "02000000 2f61",   // old
                "03000000 2f6263", // new
                "01",              // is_dir
            ]),
        ),
        (
            Request::PutChunk {
                path: "/f".into(),
                idx: 0x0102_0304_0506_0708,
                meta: META,
                data: Bytes::from_static(b"q"),
            },
            22,
            Some(with_meta(
                &["02000000 2f66", "0807060504030201"], // path, idx
                &META_HEX,
                &["71"], // data (payload tail)
            )),
        ),
        (
            Request::AppendReserve {
                path: "/f".into(),
                len: 0x0102_0304_0506_0708,
            },
            23,
            Some(vec!["02000000 2f66", "0807060504030201"]),
        ),
        (
            Request::FlushStatus { prefix: "/".into() },
            25,
            Some(vec!["01000000 2f"]),
        ),
        (
            Request::Flush {
                prefix: "/d".into(),
            },
            26,
            Some(vec!["02000000 2f64"]),
        ),
        (Request::Sync, 24, Some(vec![])),
        (Request::Rebalance { start: true }, 28, Some(vec!["01"])),
        (Request::Rebalance { start: false }, 28, Some(vec!["00"])),
        (
            Request::AdoptChunk {
                path: "/g".into(),
                idx: 2,
                meta: DIR_META,
                data: Bytes::new(),
            },
            29,
            // No data: the payload ends with the record.
            Some(with_meta(
                &["02000000 2f67", "0200000000000000"],
                &DIR_META_HEX,
                &[],
            )),
        ),
        (
            Request::Lane { cpu: 0x0102_0304 },
            30,
            Some(vec!["04030201"]),
        ),
        (
            Request::ShmAttach {
                fd: -1,
                base: 0x0000_7f01_0203_0000,
                len: 3 << 20,
            },
            31,
            Some(vec![
                "ffffffff",         // fd i32
                "00000302017f0000", // base u64
                "0000300000000000", // len u64
            ]),
        ),
        (
            Request::Lookup {
                path: "/in".into(),
                max_age_ms: 1000,
            },
            32,
            Some(vec![
                "03000000 2f696e", // path: u32 length, bytes
                "e8030000",        // max_age_ms u32
            ]),
        ),
        (
            Request::WatchStat {
                path: "/in".into(),
                contact: "h:1".into(),
                keep_ms: 500,
            },
            33,
            Some(vec![
                "03000000 2f696e", // path
                "03000000 683a31", // contact
                "f4010000",        // keep_ms u32
            ]),
        ),
        (
            Request::Invalidate { path: "/in".into() },
            34,
            Some(vec!["03000000 2f696e"]),
        ),
        (
            Request::NodeLocal {
                prefix: "/.nl".into(),
            },
            35,
            Some(vec!["04000000 2f2e6e6c"]), // prefix: u32 length, bytes
        ),
        (
            Request::NodeLocal {
                prefix: String::new(),
            },
            35,
            Some(vec!["00000000"]), // none
        ),
        (
            Request::ListTree {
                prefix: "/d".into(),
                after: "/d/é".into(),
                max: 0x0102_0304,
                flags: msg::tree::META,
            },
            36,
            Some(vec![
                "02000000 2f64",       // prefix
                "05000000 2f642fc3a9", // after: a full path (UTF-8)
                "04030201",            // max
                "01",                  // flags (META)
            ]),
        ),
        (
            Request::ListTree {
                prefix: "/".into(),
                after: String::new(),
                max: 7,
                flags: 0,
            },
            36,
            Some(vec!["01000000 2f", "00000000", "07000000", "00"]),
        ),
        (
            Request::DirVersion { path: "/d".into() },
            37,
            Some(vec!["02000000 2f64"]), // path: u32 length, bytes
        ),
        (
            Request::StatData {
                path: "/f".into(),
                max: 0x0001_0000,
            },
            39,
            Some(vec!["02000000 2f66", "00000100"]), // path, max
        ),
        (
            Request::ReadSpans {
                path: "/f".into(),
                fileid: 0x0a0b_0c0d,
                chunk_size: 0x0001_0000,
                flags: msg::rw::DAMAGED,
                epoch: 9,
                spans: vec![(3, 0, 47008), (5, 0x0000_6f40, 2)],
            },
            38,
            Some(vec![
                "02000000 2f66",                      // path
                "0d0c0b0a",                           // fileid
                "00000100",                           // chunk size
                "0800",                               // flags (DAMAGED)
                "09000000",                           // epoch
                "02000000",                           // span count
                "0300000000000000 00000000 a0b70000", // chunk, offset, length
                "0500000000000000 406f0000 02000000", // chunk, offset, length
            ]),
        ),
        (
            Request::ReadSpansPlaced {
                path: "/f".into(),
                fileid: 0x0a0b_0c0d,
                chunk_size: 0x0001_0000,
                flags: msg::rw::DAMAGED,
                epoch: 9,
                spans: vec![(3, 0, 47008), (5, 0x0000_6f40, 2)],
            },
            41,
            Some(vec![
                "02000000 2f66",                      // path
                "0d0c0b0a",                           // fileid
                "00000100",                           // chunk size
                "0800",                               // flags (DAMAGED)
                "09000000",                           // epoch
                "02000000",                           // span count
                "0300000000000000 00000000 a0b70000", // chunk, offset, length
                "0500000000000000 406f0000 02000000", // chunk, offset, length
            ]),
        ),
        (
            Request::WriteSpans {
                path: "/f".into(),
                fileid: 0x0a0b_0c0d,
                chunk_size: 0x0001_0000,
                mode: 0o100644,
                flags: msg::rw::MODIFIED,
                epoch: 9,
                spans: vec![(3, 0xfffe, 2), (5, 0, 1)],
                data: Bytes::from_static(b"abc"),
            },
            40,
            Some(vec![
                "02000000 2f66",                      // path
                "0d0c0b0a",                           // fileid
                "00000100",                           // chunk size
                "a4810000",                           // mode
                "0400",                               // flags (MODIFIED)
                "09000000",                           // epoch
                "02000000",                           // span count
                "0300000000000000 feff0000 02000000", // chunk, offset, length
                "0500000000000000 00000000 01000000", // chunk, offset, length
                "616263",                             // the spans' bytes
            ]),
        ),
    ];
    for (i, (req, opcode, want)) in cases.iter().enumerate() {
        let name = request_name(req);
        seen.insert(name);
        g.value(&format!("opcode of {name}"), req.op(), *opcode);
        let mut b = Vec::new();
        req.encode(&mut b);
        // The golden bytes are also what a receiver accepts.
        assert_eq!(
            &Request::decode(*opcode, Bytes::from(b.clone())).unwrap(),
            req,
            "{name}"
        );
        if let Some(want) = want {
            g.bytes(&format!("request #{i} {name}"), &b, want);
        }
    }
    let all: BTreeSet<_> = REQUEST_VARIANTS.into_iter().collect();
    assert_eq!(seen, all, "a request variant has no golden case");
    g.finish();
}

/// The client builds a write's payload head by itself (the data then goes
/// from the caller's buffer): it must be the head of `Request::Write`.
#[test]
fn write_head_is_the_head_of_a_write() {
    let req = Request::Write {
        path: "/x".into(),
        fileid: 0x0102_0304,
        chunk_size: 0x1112_1314,
        mode: 0o100600,
        idx: 0x2122_2324_2526_2728,
        off: 0x3132_3334,
        flags: rw::BACKEND | rw::MODIFIED,
        epoch: 0x4142_4344,
        data: Bytes::from_static(b"data"),
    };
    let mut whole = Vec::new();
    req.encode(&mut whole);
    let mut head = Vec::new();
    encode_write_head(
        &mut head,
        &WriteHead {
            path: "/x",
            fileid: 0x0102_0304,
            chunk_size: 0x1112_1314,
            mode: 0o100600,
            idx: 0x2122_2324_2526_2728,
            off: 0x3132_3334,
            flags: rw::BACKEND | rw::MODIFIED,
            epoch: 0x4142_4344,
        },
    );
    head.extend_from_slice(b"data");
    assert_eq!(hex(&head), hex(&whole));
}

/// A whole frame as it crosses the wire: header, then payload.
#[test]
fn whole_frame() {
    let mut g = Golden::default();
    let req = Request::Stat { path: "/a".into() };
    let mut payload = Vec::new();
    req.encode(&mut payload);
    let h = Header {
        len: payload.len() as u32,
        id: 42,
        op: req.op(),
        flags: 0,
    };
    let mut frame = h.encode().to_vec();
    frame.extend_from_slice(&payload);
    g.bytes(
        "Stat frame",
        &frame,
        &[
            "06000000",         // len
            "2a00000000000000", // id 42
            "0b00",             // op STAT
            "0000",             // flags
            "02000000 2f61",    // payload: path
        ],
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// Responses

/// Every response variant, by name (see [`request_name`]).
fn response_name(r: &Response) -> &'static str {
    match r {
        Response::Ok => "Ok",
        Response::Servers(_) => "Servers",
        Response::Status(_) => "Status",
        Response::Meta(_) => "Meta",
        Response::Created { .. } => "Created",
        Response::Written(_) => "Written",
        Response::Data(_) => "Data",
        Response::Entries { .. } => "Entries",
        Response::Bool(_) => "Bool",
        Response::Count(_) => "Count",
        Response::FlushState(_) => "FlushState",
        Response::Rebalance(_) => "Rebalance",
        Response::Sized { .. } => "Sized",
        Response::Tree(_) => "Tree",
        Response::DirVersion(_) => "DirVersion",
        Response::MetaData { .. } => "MetaData",
    }
}

const RESPONSE_VARIANTS: [&str; 16] = [
    "Ok",
    "Servers",
    "Status",
    "Meta",
    "Created",
    "Written",
    "Data",
    "Entries",
    "Bool",
    "Count",
    "FlushState",
    "Rebalance",
    "Sized",
    "Tree",
    "DirVersion",
    "MetaData",
];

#[test]
fn responses() {
    let mut g = Golden::default();
    let mut seen = BTreeSet::new();
    let status = ServerStatus {
        addr: "h:1".into(),
        store: "pmem".into(),
        entries: 0x01,
        bytes: 0x02,
        capacity: 0x03,
        requests: 0x04,
        forwarded: 0x05,
        reads: 0x06,
        writes: 0x07,
        cma_writes: 0x08,
        shm_writes: 0x09,
        list_version: 0x0a,
        since: 0x0b,
        lost: 0x0c,
        refused: 0x0d,
        denied: 0x0e,
        over_limit: 0x0f,
        idle_closed: 0x10,
        throttled: 0x0102_0304_0506_0708,
        poll_hits: 0x11,
        poll_misses: 0x12,
        cpu_ns: 0x13,
        connections: 0x14,
        peers: 0x15,
        lookups: 0x16,
        lookup_hits: 0x17,
        lookup_forwards: 0x18,
        node_local_entries: 0x19,
        node_local_bytes: 0x1a,
        fabric_sessions: 0x1b,
        fabric_expired: 0x1c,
        rma_pulls: 0x1d,
        rma_pushes: 0x1e,
        reg_fallbacks: 0x1f,
        fabric_peers: 0x24,
        fabric_no_session: 0x25,
        fabric_no_session_dropped: 0x26,
        fabric_replies_dropped: 0x27,
        fabric_lent_pulls: 0x28,
        fabric_rma_most: 0x29,
        fabric_hellos_dropped: 0x2a,
        shm_reads: 0x2b,
        rss: 0x2c,
        heap_free: 0x2d,
        heap_trims: 0x2e,
        backend: "/b".into(),
        flush: FlushState {
            chunks: 0x21,
            bytes: 0x22,
            failing: 0x23,
            last_error: "e".into(),
            last_errno: libc::EIO,
        },
    };
    let cases: Vec<(Response, Vec<&str>)> = vec![
        (Response::Ok, vec!["00"]),
        (Response::Servers(three_servers()), {
            let mut v = vec!["01"];
            v.extend(THREE_SERVERS_HEX);
            v
        }),
        (
            Response::Status(Box::new(status)),
            vec![
                "02",                // tag
                "03000000 683a31",   // addr
                "04000000 706d656d", // store
                "0100000000000000",  // entries
                "0200000000000000",  // bytes
                "0300000000000000",  // capacity
                "0400000000000000",  // requests
                "0500000000000000",  // forwarded
                "0600000000000000",  // reads
                "0700000000000000",  // writes
                "0800000000000000",  // cma_writes
                "0900000000000000",  // shm_writes
                "0a00000000000000",  // list_version
                "0b00000000000000",  // since
                "0c00000000000000",  // lost
                "0d00000000000000",  // refused
                "0e00000000000000",  // denied
                "0f00000000000000",  // over_limit
                "1000000000000000",  // idle_closed
                "0807060504030201",  // throttled
                "1100000000000000",  // poll_hits
                "1200000000000000",  // poll_misses
                "1300000000000000",  // cpu_ns
                "1400000000000000",  // connections
                "1500000000000000",  // peers
                "1600000000000000",  // lookups
                "1700000000000000",  // lookup_hits
                "1800000000000000",  // lookup_forwards
                "1900000000000000",  // node_local_entries
                "1a00000000000000",  // node_local_bytes
                "1b00000000000000",  // fabric_sessions
                "1c00000000000000",  // fabric_expired
                "1d00000000000000",  // rma_pulls
                "1e00000000000000",  // rma_pushes
                "1f00000000000000",  // reg_fallbacks
                "2400000000000000",  // fabric_peers
                "2500000000000000",  // fabric_no_session
                "2600000000000000",  // fabric_no_session_dropped
                "2700000000000000",  // fabric_replies_dropped
                "2800000000000000",  // fabric_lent_pulls
                "2900000000000000",  // fabric_rma_most
                "2a00000000000000",  // fabric_hellos_dropped
                "2b00000000000000",  // shm_reads
                "2c00000000000000",  // rss
                "2d00000000000000",  // heap_free
                "2e00000000000000",  // heap_trims
                "02000000 2f62",     // backend
                "2100000000000000",  // flush.chunks
                "2200000000000000",  // flush.bytes
                "2300000000000000",  // flush.failing
                "01000000 65",       // flush.last_error
                "05000000",          // flush.last_errno (EIO)
            ],
        ),
        (Response::Meta(META), with_meta(&["03"], &META_HEX, &[])),
        (
            Response::MetaData {
                meta: META,
                data: Bytes::from_static(b"hi"),
            },
            // tag, the entry, the file's bytes: the payload tail, no length
            with_meta(&["0f"], &META_HEX, &["6869"]),
        ),
        (
            Response::Created {
                meta: META,
                created: true,
            },
            with_meta(&["04"], &META_HEX, &["01"]),
        ),
        (Response::Written(0x0102_0304), vec!["05", "04030201"]),
        (
            Response::Data(Bytes::from_static(b"hello")),
            vec!["06", "68656c6c6f"], // data: the payload tail, no length
        ),
        (Response::Data(Bytes::new()), vec!["06"]),
        (
            Response::Entries {
                entries: vec![
                    DirEntry {
                        name: "a".into(),
                        meta: META,
                    },
                    DirEntry {
                        name: "sub".into(),
                        meta: DIR_META,
                    },
                ],
                done: true,
            },
            {
                let mut v = with_meta(
                    &[
                        "07",          // tag
                        "01",          // done (before the entries)
                        "02000000",    // count
                        "01000000 61", // name "a"
                    ],
                    &META_HEX,
                    &["03000000 737562"], // name "sub"
                );
                v.extend(DIR_META_HEX);
                v
            },
        ),
        (
            Response::Entries {
                entries: vec![],
                done: false,
            },
            vec!["07", "00", "00000000"],
        ),
        (Response::Bool(true), vec!["08", "01"]),
        (Response::Bool(false), vec!["08", "00"]),
        (
            Response::Count(0x0102_0304_0506_0708),
            vec!["09", "0807060504030201"],
        ),
        (
            Response::DirVersion(msg::DirVersion {
                born: 0x0102_0304_0506_0708,
                changes: 9,
                list: 3,
            }),
            vec![
                "0e",               // tag
                "0807060504030201", // born
                "0900000000000000", // changes
                "0300000000000000", // list (the server list's version)
            ],
        ),
        (
            Response::FlushState(FlushState {
                chunks: 1,
                bytes: 2,
                failing: 3,
                last_error: "x".into(),
                last_errno: -2,
            }),
            vec![
                "0a",               // tag
                "0100000000000000", // chunks
                "0200000000000000", // bytes
                "0300000000000000", // failing
                "01000000 78",      // last_error
                "feffffff",         // last_errno
            ],
        ),
        (
            Response::Rebalance(RebalanceState {
                running: true,
                version: 1,
                moved: 2,
                kept: 3,
                failed: 4,
                last_error: "y".into(),
                last_errno: libc::ETIMEDOUT,
            }),
            vec![
                "0b",               // tag
                "01",               // running
                "0100000000000000", // version
                "0200000000000000", // moved
                "0300000000000000", // kept
                "0400000000000000", // failed
                "01000000 79",      // last_error
                "6e000000",         // last_errno (ETIMEDOUT)
            ],
        ),
        (
            Response::Sized {
                meta: META,
                before: 0x0102_0304_0506_0708,
            },
            with_meta(&["0c"], &META_HEX, &["0807060504030201"]),
        ),
        (
            Response::Tree({
                let mut t = TreePage::default();
                t.push("/d/a", &META, false);
                t.push("/d/ab", &DIR_META, false);
                t.push("/d/ab/é", &META, false);
                t.push("/e", &META, false);
                t
            }),
            vec![
                "0d",                 // tag
                "00",                 // done
                "00",                 // no metadata records
                "04000000",           // count
                "0000 0400 2f642f61", // shares 0 bytes, 4 more: "/d/a"
                "08",                 // type: regular file
                "0400 0100 62",       // shares "/d/a", then "b"
                "04",                 // directory
                "0500 0300 2fc3a9",   // shares "/d/ab", then "/é"
                "08",                 //
                "0100 0100 65",       // shares "/", then "e"
                "08",
            ],
        ),
        (
            Response::Tree({
                let mut t = TreePage {
                    done: true,
                    ..Default::default()
                };
                t.push("/x", &DIR_META, true);
                t
            }),
            {
                let mut v = vec![
                    "0d",             // tag
                    "01",             // done
                    "01",             // metadata records follow the types
                    "01000000",       // count
                    "0000 0200 2f78", // "/x"
                    "04",             // directory
                ];
                v.extend(DIR_META_HEX);
                v
            },
        ),
        (
            Response::Tree(TreePage {
                done: true,
                ..Default::default()
            }),
            vec!["0d", "01", "00", "00000000"],
        ),
    ];
    for (i, (resp, want)) in cases.iter().enumerate() {
        let name = response_name(resp);
        seen.insert(name);
        let mut b = Vec::new();
        resp.encode(&mut b);
        assert_eq!(
            &Response::decode(Bytes::from(b.clone())).unwrap(),
            resp,
            "{name}"
        );
        g.bytes(&format!("response #{i} {name}"), &b, want);
    }
    let all: BTreeSet<_> = RESPONSE_VARIANTS.into_iter().collect();
    assert_eq!(seen, all, "a response variant has no golden case");
    g.finish();
}

#[test]
fn error_reply() {
    let mut g = Golden::default();
    let e = ErrorReply::new(libc::ENOENT, "no such entry");
    let mut b = Vec::new();
    encode_error(&mut b, &e);
    g.bytes(
        "error reply",
        &b,
        &[
            "02000000",                            // errno i32 (ENOENT)
            "0d000000 6e6f207375636820656e747279", // message
        ],
    );
    assert_eq!(msg::decode_error(Bytes::from(b)).unwrap(), e);
    let e = ErrorReply::new(-1, "");
    let mut b = Vec::new();
    encode_error(&mut b, &e);
    g.bytes("error reply, negative errno", &b, &["ffffffff", "00000000"]);
    g.finish();
}

// ---------------------------------------------------------------------------
// Server list

#[test]
fn server_list() {
    let mut g = Golden::default();
    let enc = |l: &ServerList| {
        let mut b = Vec::new();
        Request::UpdateServers { list: l.clone() }.encode(&mut b);
        b
    };
    g.bytes(
        "modular list, since absent",
        &enc(&ServerList {
            version: 1,
            hashing: Hashing::Modular,
            servers: vec!["10.0.0.1:50000".into(), "n2:7".into()],
            since: vec![],
        }),
        &[
            "0100000000000000",                      // version
            "00",                                    // hashing (modular)
            "02000000",                              // count
            "0e000000 31302e302e302e313a3530303030", // "10.0.0.1:50000"
            "0000000000000000",                      // since: absent is 0
            "04000000 6e323a37",                     // "n2:7"
            "0000000000000000",                      // since
        ],
    );
    // Missing `since` entries are 0 on the wire; all zeros decode as none.
    let sparse = ServerList {
        version: 2,
        hashing: Hashing::Modular,
        servers: vec!["a:1".into(), "b:2".into()],
        since: vec![0, 0],
    };
    let dense = ServerList {
        since: vec![],
        ..sparse.clone()
    };
    assert_eq!(hex(&enc(&sparse)), hex(&enc(&dense)));
    assert_eq!(
        Request::decode(op::UPDATE_SERVERS, Bytes::from(enc(&sparse))).unwrap(),
        Request::UpdateServers { list: dense }
    );
    g.bytes(
        "empty list",
        &enc(&ServerList::default()),
        &["0000000000000000", "00", "00000000"],
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// Handshake

#[test]
fn handshake_messages() {
    let mut g = Golden::default();
    let mut nonce = [0u8; NONCE_LEN];
    for (i, b) in nonce.iter_mut().enumerate() {
        *b = i as u8;
    }
    let hello = Hello {
        version: PROTOCOL_VERSION,
        role: Role::Server,
        has_key: true,
        nonce,
    };
    g.bytes(
        "hello",
        &hello.encode(),
        &[
            "434846532d525301", // magic "CHFS-RS\x01"
            "0d00",             // version u16
            "02",               // role (server)
            "01",               // has_key
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", // nonce
        ],
    );
    assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
    let open = HelloReply {
        version: PROTOCOL_VERSION,
        status: 0,
        message: String::new(),
        auth: Auth::Open,
    };
    g.bytes(
        "hello reply, open pool",
        &open.encode(),
        &[
            "434846532d525301", // magic
            "0d00",             // version
            "00000000",         // status i32
            "0000",             // message length u16, no message
            "00",               // auth: open
        ],
    );
    let challenge = HelloReply {
        version: PROTOCOL_VERSION,
        status: 0,
        message: String::new(),
        auth: Auth::Challenge {
            nonce: [0xa5; NONCE_LEN],
            proof: [0x5a; 32],
        },
    };
    g.bytes(
        "hello reply, challenge",
        &challenge.encode(),
        &[
            "434846532d525301", // magic
            "0d00",             // version
            "00000000",         // status
            "0000",             // message length
            "01",               // auth: challenge
            &"a5".repeat(32),   // acceptor's nonce
            &"5a".repeat(32),   // acceptor's proof
        ],
    );
    let refusal = HelloReply::refusal(libc::EACCES, "no");
    g.bytes(
        "hello reply, refusal",
        &refusal.encode(),
        &[
            "434846532d525301", // magic
            "0d00",             // version
            "0d000000",         // status (EACCES)
            "0200 6e6f",        // message "no"; no auth byte after a refusal
        ],
    );
    // What a connector of another version reads: laid out as version 3
    // did (magic, version, status, length, text), whatever the version.
    g.bytes(
        "hello reply, version refusal",
        &version_refusal(3).encode(),
        &[
            "434846532d525301", // magic
            "0d00",             // the acceptor's version
            "47000000",         // status (EPROTO)
            "7300",             // message length (115)
            // "protocol version 3 not supported: this server speaks version 13
            // (use client and server of the same chfs-rs release)"
            "70726f746f636f6c2076657273696f6e2033206e6f7420737570706f727465643a20",
            "746869732073657276657220737065616b732076657273696f6e20313320",
            "2875736520636c69656e7420616e6420736572766572206f66207468652073616d65",
            "20636866732d72732072656c6561736529",
        ],
    );
    g.bytes(
        "verdict, accepted",
        &accepted().encode(),
        &["00000000", "0000"], // status i32, message length u16
    );
    let v = Verdict {
        status: libc::EACCES,
        message: "bad".into(),
    };
    g.bytes(
        "verdict, refused",
        &v.encode(),
        &["0d000000", "0300 626164"],
    );
    g.finish();
}

type HmacSha256 = Hmac<Sha256>;

/// A proof as documented in `handshake.rs`:
/// `HMAC-SHA-256(key(role), label | version (u16 LE) | role | nc | ns)`.
fn documented_proof(key: &[u8], label: &[u8], role: Role, nc: &[u8], ns: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).unwrap();
    m.update(label);
    m.update(&PROTOCOL_VERSION.to_le_bytes());
    m.update(&[role.code()]);
    m.update(nc);
    m.update(ns);
    m.finalize().into_bytes().into()
}

#[test]
fn handshake_keys_and_proofs() {
    let mut g = Golden::default();
    // Key derivation (HKDF-SHA-256, salt "chfs-rs pool secret", the role's
    // label as info): a change locks every existing pool out.
    let keys = Keys::from_secret(b"secret");
    g.bytes(
        "client key",
        keys.get(Role::Client),
        &["3d6ce4e17f05eb452aa67c1c3f4ef2ee098aea6991017d553f5a70406208ec19"],
    );
    g.bytes(
        "server key",
        keys.get(Role::Server),
        &["c06ca7cc2221e70752ef59e65ba469f919a3051578f540dd1bfb9d8aaddcd458"],
    );
    g.bytes(
        "admin key",
        keys.get(Role::Admin),
        &["3611d25179b5177e2920387ce1ba449980a664e111c4ec09058f9ef45c21ace1"],
    );
    g.value(
        "client key file",
        Credential::client_key_file(b"secret"),
        format!("{CLIENT_KEY_PREFIX}{}\n", hex(keys.get(Role::Client))),
    );
    // The proofs: the acceptor's for a fixed connector nonce (its own
    // nonce is random, so the expected proof is computed as documented),
    // and the connector's answer the acceptor accepts.
    let nc = [0x11; NONCE_LEN];
    for role in [Role::Client, Role::Server, Role::Admin] {
        let hello = Hello {
            version: PROTOCOL_VERSION,
            role,
            has_key: true,
            nonce: nc,
        };
        let Accept::Challenge(reply, pending) = accept(&hello, Some(&keys)) else {
            panic!("a pool with a secret challenges");
        };
        let Auth::Challenge { nonce: ns, proof } = reply.auth else {
            panic!("a challenge has a nonce and a proof");
        };
        let key = keys.get(role);
        g.bytes(
            &format!("acceptor's proof as {role}"),
            &proof,
            &[&hex(&documented_proof(
                key,
                b"chfs-rs server proof",
                role,
                &nc,
                &ns,
            ))],
        );
        let answer = documented_proof(key, b"chfs-rs client proof", role, &nc, &ns);
        assert_eq!(pending.check(&answer).map_err(|e| e.1), Ok(role));
    }
    // And one proof with fixed inputs, as bytes.
    g.bytes(
        "server proof, fixed nonces",
        &documented_proof(
            keys.get(Role::Client),
            b"chfs-rs server proof",
            Role::Client,
            &[1; 32],
            &[2; 32],
        ),
        &["7d69477a19871b8e594635e67febbcf7128569b02ebe8eab42bfd3515e130e14"],
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// Placement

#[test]
fn path_hash_values() {
    let mut g = Golden::default();
    for (path, want) in [
        ("/", 0x4742_9295_3285_562e_u64),
        ("/a", 0xe292_ab48_a6b0_6805),
        ("/dir/file.txt", 0x5754_741f_3c04_6eb1),
        ("/日本語", 0x3635_cf60_5f6c_e648),
    ] {
        g.value(&format!("path_hash({path:?})"), path_hash(path), want);
    }
    g.finish();
}

fn ring(n: usize, hashing: Hashing) -> Ring {
    Ring::new(ServerList {
        version: 1,
        hashing,
        servers: (0..n).map(|i| format!("10.0.0.{}:50000", i + 1)).collect(),
        since: Vec::new(),
    })
}

#[test]
fn chunk_owners() {
    let mut g = Golden::default();
    let paths = ["/", "/a", "/dir/file.txt", "/日本語"];
    for (hashing, n, want) in [
        // Paths: "/", "/a", "/dir/file.txt", "/日本語".
        (
            Hashing::Modular,
            3,
            [
                [0, 1, 2, 0, 1, 2],
                [1, 2, 0, 1, 2, 0],
                [0, 1, 2, 0, 1, 2],
                [0, 1, 2, 0, 1, 2],
            ],
        ),
        (
            Hashing::Modular,
            5,
            [
                [2, 3, 4, 0, 1, 2],
                [1, 2, 3, 4, 0, 1],
                [4, 0, 1, 2, 3, 4],
                [0, 1, 2, 3, 4, 0],
            ],
        ),
        (
            Hashing::Consistent,
            3,
            [
                [0, 2, 0, 2, 0, 0],
                [1, 2, 1, 1, 2, 0],
                [1, 2, 2, 1, 2, 0],
                [2, 1, 2, 1, 1, 0],
            ],
        ),
        (
            Hashing::Consistent,
            5,
            [
                [0, 3, 3, 2, 0, 0],
                [1, 2, 1, 1, 4, 0],
                [1, 2, 3, 1, 4, 0],
                [3, 4, 3, 1, 1, 0],
            ],
        ),
    ] {
        let r = ring(n, hashing);
        for (p, want) in paths.iter().zip(want) {
            let got: Vec<usize> = (0..6).map(|i| r.owner(p, i)).collect();
            g.value(
                &format!("owners of {p:?} chunks 0..6, {hashing:?}, {n} servers"),
                got,
                want.to_vec(),
            );
        }
    }
    // A chunk index far out: (hash + idx) mod N without wrapping at 2^64
    // (u64::MAX is 0 mod 5), the consistent key is the index's 8 bytes
    // hashed with the path hash as seed.
    let r = ring(5, Hashing::Modular);
    g.value("modular, idx u64::MAX", r.owner("/a", u64::MAX), 1);
    let r = ring(5, Hashing::Consistent);
    g.value("consistent, idx u64::MAX", r.owner("/a", u64::MAX), 1);
    // The stripe stays round robin where hash + idx passes 2^64 (the sum
    // used to wrap there first: with 3 servers and a hash of u64::MAX,
    // chunks 0 and 1 both went to server 0).
    let r = ring(3, Hashing::Modular);
    g.value(
        "modular wrap, hash u64::MAX, chunks 0..3",
        (0..3)
            .map(|i| r.owner_of_hash(u64::MAX, i))
            .collect::<Vec<_>>(),
        vec![0, 1, 2],
    );
    g.finish();
}
