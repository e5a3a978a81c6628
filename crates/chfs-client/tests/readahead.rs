//! Strided read-ahead of descriptors (`CHFS_READ_AHEAD`,
//! `client/ahead.rs`): reads give exactly what plain reads give whatever
//! the pattern (strided, sequential, backwards, random, mixed, across
//! chunk boundaries, holes and the end of the file, with writes through
//! the same descriptor in between), records fetched ahead
//! cost one request per chunk, this process's own writes are seen at
//! once, others' within the buffer's age, and servers that do not know
//! `ReadSpans` are read record by record.

mod common;

use std::time::Duration;

use chfs_client::Client;
use common::*;
use proptest::prelude::*;

/// Sum over the servers of their `reads` counter (a `Read` or a
/// `ReadSpans` each).
fn server_reads(c: &Client) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).reads)
        .sum()
}

/// Writes `data` to a new file `path` of chunk size `cs`, leaving `holes`
/// (ranges never written), and returns the file's bytes as a plain reader
/// sees them.
fn make_file(c: &Client, path: &str, cs: u32, size: usize, holes: &[(usize, usize)]) -> Vec<u8> {
    let mut want = pattern(size, size as u64 ^ cs as u64);
    for &(a, b) in holes {
        want[a.min(size)..b.min(size)].fill(0);
    }
    let fd = c
        .open_chunk_size(path, libc::O_CREAT | libc::O_WRONLY, 0o644, cs)
        .unwrap();
    // The bytes outside the holes, then the size.
    let mut at = 0;
    let mut cuts: Vec<(usize, usize)> = holes.to_vec();
    cuts.sort();
    for (a, b) in cuts.into_iter().chain([(size, size)]) {
        let a = a.min(size);
        if a > at {
            c.pwrite(fd, &want[at..a], at as u64).unwrap();
        }
        at = at.max(b.min(size));
    }
    c.ftruncate(fd, size as u64).unwrap();
    c.close(fd).unwrap();
    want
}

/// What a plain `pread` of `len` bytes at `off` gives for a file `want`.
fn model(want: &[u8], off: u64, len: usize) -> Vec<u8> {
    let a = (off as usize).min(want.len());
    let b = (off as usize).saturating_add(len).min(want.len());
    want[a..b].to_vec()
}

fn pread(c: &Client, fd: i32, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0xa5u8; len];
    let n = c.pread(fd, &mut b, off).unwrap();
    b.truncate(n);
    b
}

/// A read pattern: (offset, length) of each read.
fn reads() -> impl Strategy<Value = Vec<(u64, usize)>> {
    let strided =
        (0u64..9000, 1usize..3000, 0u64..4000, 3usize..40).prop_map(|(start, len, gap, n)| {
            (0..n as u64)
                .map(|i| (start + i * (len as u64 + gap), len))
                .collect::<Vec<_>>()
        });
    let sequential = (0u64..9000, 1usize..3000, 3usize..40).prop_map(|(start, len, n)| {
        (0..n as u64)
            .map(|i| (start + i * len as u64, len))
            .collect::<Vec<_>>()
    });
    let backwards = (9000u64..40000, 1usize..3000, 3usize..20).prop_map(|(end, len, n)| {
        (0..n as u64)
            .map(|i| (end.saturating_sub(i * len as u64), len))
            .collect::<Vec<_>>()
    });
    let random = proptest::collection::vec((0u64..40000, 0usize..5000), 1..30);
    let part = prop_oneof![strided, sequential, backwards, random];
    proptest::collection::vec(part, 1..4).prop_map(|v| v.concat())
}

/// A case: a file of `size` bytes in chunks of `cs` with `holes`, read
/// with `reads` through one descriptor and written through it with
/// `writes` (see [`run_case`]).
type Case = (
    usize,
    u32,
    Vec<(usize, usize)>,
    Vec<(u64, usize)>,
    Vec<(usize, u64, usize)>,
);

fn cases() -> impl Strategy<Value = Case> {
    (
        0usize..40000,
        prop_oneof![Just(1000u32), Just(4096), Just(65536)],
        proptest::collection::vec((0usize..40000, 0usize..6000), 0..4)
            .prop_map(|v| v.into_iter().map(|(a, l)| (a, a + l)).collect::<Vec<_>>()),
        reads(),
        prop_oneof![
            Just(Vec::new()),
            proptest::collection::vec((0usize..60, 0u64..40000, 1usize..3000), 1..6),
        ],
    )
}

struct Shared {
    _pool: LocalPool,
    client: Client,
}

fn new_shared() -> Shared {
    let pool = LocalPool::start(2).expect("pool");
    let client = client(&pool, |c| c.read_ahead = 16 * 1024);
    Shared {
        _pool: pool,
        client,
    }
}

/// The same over `ofi+tcp`, with an RDMA threshold of 4 KiB: records
/// fetched ahead land by the server's RMA from 4 KiB on, in the reply
/// below that.
fn new_fabric_shared() -> Option<Shared> {
    let pool = fabric_pool(2, "reads_match_plain_reads_over_ofi_tcp")?;
    let secret = pool.secret().unwrap().as_bytes().to_vec();
    let client = client(&pool, |c| {
        c.read_ahead = 16 * 1024;
        c.rdma_thresh = 4096;
        c.secret = secret;
    });
    Some(Shared {
        _pool: pool,
        client,
    })
}

/// The same over TCP: reads of several chunks go by server through the
/// socket (no landing area).
fn new_tcp_shared() -> Shared {
    let pool = LocalPool::start(2).expect("pool");
    let client = client(&pool, |c| {
        c.read_ahead = 16 * 1024;
        c.local_socket = false;
    });
    Shared {
        _pool: pool,
        client,
    }
}

thread_local! {
    static SHARED: Shared = new_shared();
    static TCP: Shared = new_tcp_shared();
    static FABRIC: Option<Shared> = new_fabric_shared();
}

/// Reads `reads` through one descriptor (read-only, or read-write with
/// `writes` through it too: (before which read, offset, length)) and
/// compares each with what a plain read gives.
fn run_case(
    c: &Client,
    size: usize,
    cs: u32,
    holes: &[(usize, usize)],
    reads: &[(u64, usize)],
    writes: &[(usize, u64, usize)],
) -> Result<(), TestCaseError> {
    static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    {
        let path = format!(
            "/case{}",
            CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut want = make_file(c, &path, cs, size, holes);
        let flags = if writes.is_empty() {
            libc::O_RDONLY
        } else {
            libc::O_RDWR
        };
        let fd = c.open(&path, flags, 0).unwrap();
        for (i, &(off, len)) in reads.iter().enumerate() {
            for &(_, woff, wlen) in writes.iter().filter(|w| w.0 == i) {
                let b = pattern(wlen, woff ^ i as u64);
                c.pwrite(fd, &b, woff).unwrap();
                let end = woff as usize + wlen;
                if want.len() < end {
                    want.resize(end, 0);
                }
                want[woff as usize..end].copy_from_slice(&b);
            }
            let got = pread(c, fd, off, len);
            prop_assert!(
                got == model(&want, off, len),
                "read {} ({} bytes at {}) of {:?} differs",
                i,
                len,
                off,
                reads
            );
        }
        c.close(fd).unwrap();
        c.unlink(&path).unwrap();
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, max_shrink_iters: 500, ..ProptestConfig::default() })]
    #[test]
    fn reads_match_plain_reads(
        (size, cs, holes, reads, writes) in cases(),
    ) {
        SHARED.with(|s| run_case(&s.client, size, cs, &holes, &reads, &writes))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 200, ..ProptestConfig::default() })]
    /// The same over TCP.
    #[test]
    fn reads_match_plain_reads_over_tcp(
        (size, cs, holes, reads, writes) in cases(),
    ) {
        TCP.with(|s| run_case(&s.client, size, cs, &holes, &reads, &writes))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 200, ..ProptestConfig::default() })]
    /// The same over `ofi+tcp`: records fetched ahead by the servers' RMA
    /// writes into the read-ahead buffer (4 KiB or more) or in replies.
    #[test]
    fn reads_match_plain_reads_over_ofi_tcp(
        (size, cs, holes, reads, writes) in cases(),
    ) {
        FABRIC.with(|s| match s {
            Some(s) => run_case(&s.client, size, cs, &holes, &reads, &writes),
            None => Ok(()),
        })?;
    }
}

/// IOR-hard's read with -C: a rank reads every 4th record of 47,008
/// bytes. `n` records read through `c`; returns the reads the servers
/// served for them, and the requests `c` sent.
fn hard_reads(c: &Client, path: &str, want: &[u8], n: u64) -> (u64, u64) {
    let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
    let before = server_reads(c);
    let sent = c.stats().rpcs;
    for i in 0..n {
        let off = 47008 * (4 * i + 1);
        assert!(
            pread(c, fd, off, 47008) == model(want, off, 47008),
            "record {i}"
        );
    }
    let sent = c.stats().rpcs - sent;
    let after = server_reads(c);
    c.close(fd).unwrap();
    (after - before, sent)
}

/// Records 2..24 of every 4th (of 47,008 bytes) in a file of 64 KiB
/// chunks on two servers, read through `on` (1 MiB read-ahead) after the
/// two that find the pattern: one request to each server.
fn records_of_64k_chunks_cost_a_request_per_server(w: &Client, on: &Client) {
    let want = make_file(w, "/hard64k", 65536, 47008 * 4 * 30, &[]);
    let fd = on.open("/hard64k", libc::O_RDONLY, 0).unwrap();
    for i in 0..2u64 {
        let off = 47008 * (4 * i + 1);
        assert!(pread(on, fd, off, 47008) == model(&want, off, 47008));
    }
    let before = server_reads(on);
    for i in 2..24u64 {
        let off = 47008 * (4 * i + 1);
        assert!(pread(on, fd, off, 47008) == model(&want, off, 47008));
    }
    assert_eq!(server_reads(on) - before, 2);
    on.close(fd).unwrap();
}

#[test]
fn strided_records_cost_one_request_per_chunk() {
    let p = LocalPool::start(2).expect("pool");
    let w = client(&p, |_| {});
    // One 16 MiB chunk holds 89 records of 4 ranks.
    let want = make_file(&w, "/hard", 16 << 20, 47008 * 4 * 80, &[]);
    // 1 MiB: 22 records per request. The first two reads find the
    // pattern; the third fetches records 2..24, the 24th 24..46.
    let on = client(&p, |c| c.read_ahead = 1 << 20);
    assert_eq!(hard_reads(&on, "/hard", &want, 46), (2 + 2, 2 + 2));
    let off = client(&p, |c| c.read_ahead = 0);
    assert_eq!(hard_reads(&off, "/hard", &want, 46), (46, 46));
    // Sequential records (stride = length) too.
    let fd = on.open("/hard", libc::O_RDONLY, 0).unwrap();
    let before = server_reads(&on);
    for i in 0..24u64 {
        let off = 47008 * i;
        assert!(pread(&on, fd, off, 47008) == model(&want, off, 47008));
    }
    assert_eq!(server_reads(&on) - before, 3);
    on.close(fd).unwrap();
    // 64 KiB chunks (the default): the pieces of 22 records in 33 chunks
    // of the two servers, one request to each.
    records_of_64k_chunks_cost_a_request_per_server(&w, &on);
}

#[test]
fn own_changes_are_seen_at_once_and_others_within_a_second() {
    let p = LocalPool::start(2).expect("pool");
    let c = client(&p, |c| c.read_ahead = 1 << 20);
    let mut want = make_file(&c, "/f", 65536, 4000 * 100, &[]);
    let rd = c.open("/f", libc::O_RDONLY, 0).unwrap();
    let rw = c.open("/f", libc::O_RDWR, 0).unwrap();
    // The pattern is found and records 2.. are fetched ahead.
    for i in 0..4u64 {
        assert!(pread(&c, rd, 8000 * i, 4000) == model(&want, 8000 * i, 4000));
    }
    // A write through another descriptor, a record ahead.
    let new = pattern(4000, 77);
    c.pwrite(rw, &new, 8000 * 4).unwrap();
    want[32000..36000].copy_from_slice(&new);
    assert!(pread(&c, rd, 8000 * 4, 4000) == new);
    // Fetched again; then a truncate by path.
    for i in 5..8u64 {
        assert!(pread(&c, rd, 8000 * i, 4000) == model(&want, 8000 * i, 4000));
    }
    c.truncate("/f", 8000 * 9).unwrap();
    want.truncate(8000 * 9);
    assert!(pread(&c, rd, 8000 * 8, 4000) == model(&want, 8000 * 8, 4000));
    assert!(pread(&c, rd, 8000 * 9, 4000) == Vec::<u8>::new());
    c.close(rw).unwrap();
    c.close(rd).unwrap();

    // An unlink by path: the descriptor still open reads what a plain
    // read then gives (the chunks are gone: zeros up to the size it knows).
    let want = make_file(&c, "/h", 65536, 4000 * 100, &[]);
    let rd = c.open("/h", libc::O_RDONLY, 0).unwrap();
    for i in 0..4u64 {
        assert!(pread(&c, rd, 8000 * i, 4000) == model(&want, 8000 * i, 4000));
    }
    c.unlink("/h").unwrap();
    assert!(pread(&c, rd, 8000 * 4, 4000) == vec![0u8; 4000]);
    c.close(rd).unwrap();

    // Another process's write: seen at the next open, and by an open
    // descriptor once its buffer is a second old.
    let other = client(&p, |_| {});
    let want = make_file(&c, "/g", 65536, 4000 * 100, &[]);
    let rd = c.open("/g", libc::O_RDONLY, 0).unwrap();
    for i in 0..4u64 {
        assert!(pread(&c, rd, 8000 * i, 4000) == model(&want, 8000 * i, 4000));
    }
    let ofd = other.open("/g", libc::O_WRONLY, 0).unwrap();
    let new = pattern(4000, 78);
    other.pwrite(ofd, &new, 8000 * 5).unwrap();
    other.close(ofd).unwrap();
    let fresh = c.open("/g", libc::O_RDONLY, 0).unwrap();
    assert!(pread(&c, fresh, 8000 * 5, 4000) == new);
    std::thread::sleep(Duration::from_millis(1100));
    assert!(pread(&c, rd, 8000 * 5, 4000) == new);
    c.close(rd).unwrap();
    c.close(fresh).unwrap();
}

#[test]
fn servers_without_read_spans_are_read_record_by_record() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--unknown-op".into(), "READ_SPANS".into()],
        ..Default::default()
    })
    .expect("pool");
    let w = client(&p, |_| {});
    let want = make_file(&w, "/hard", 16 << 20, 47008 * 4 * 80, &[]);
    let c = client(&p, |c| c.read_ahead = 1 << 20);
    // The refused ReadSpans (sent, not served); then Reads of the
    // records, all correct (the pattern found again after the refusal:
    // records read ahead past the 46th, two of them).
    let (reads, sent) = hard_reads(&c, "/hard", &want, 46);
    assert_eq!((reads, sent), (48, 49));
    // Remembered: no ReadSpans again.
    assert_eq!(hard_reads(&c, "/hard", &want, 46), (46, 46));
}

/// Over `ofi+tcp`, records fetched ahead come in one `ReadSpans` per
/// server too (before, fabric servers were sent a `Read` per record
/// piece), their bytes written into the read-ahead buffer by the server's
/// RMA (from `CHFS_RDMA_THRESH` on).
#[test]
fn strided_records_over_ofi_tcp_cost_one_request_per_chunk() {
    let Some(p) = fabric_pool(2, "strided_records_over_ofi_tcp_cost_one_request_per_chunk") else {
        return;
    };
    let secret = p.secret().unwrap().as_bytes().to_vec();
    let with = |ra: usize| {
        let secret = secret.clone();
        client(&p, move |c| {
            c.read_ahead = ra;
            c.secret = secret;
        })
    };
    let pushes = |c: &Client| -> u64 {
        c.server_status()
            .into_iter()
            .map(|(a, s)| {
                s.unwrap_or_else(|e| panic!("status of {a}: {e}"))
                    .rma_pushes
            })
            .sum()
    };
    let w = with(0);
    let want = make_file(&w, "/hard", 16 << 20, 47008 * 4 * 80, &[]);
    let on = with(1 << 20);
    let before = pushes(&on);
    // As over TCP: the first two reads find the pattern, the third
    // fetches records 2..24 (one request, 22 records: 1 MiB less a
    // record), the 24th 24..46. Each record read plainly and each
    // window moves by RMA (the default threshold is 32 KiB).
    assert_eq!(hard_reads(&on, "/hard", &want, 46), (2 + 2, 2 + 2));
    assert_eq!(pushes(&on) - before, 4);
    let off = with(0);
    assert_eq!(hard_reads(&off, "/hard", &want, 46), (46, 46));
    // 64 KiB chunks (the default): the pieces of 22 records in 33 chunks
    // of the two servers, one request to each.
    records_of_64k_chunks_cost_a_request_per_server(&w, &on);
    // Small records: a window below the threshold comes in the reply.
    let small = with(16 << 10);
    let want = make_file(&w, "/small", 1 << 20, 4000 * 100, &[]);
    let fd = small.open("/small", libc::O_RDONLY, 0).unwrap();
    let before = (server_reads(&small), pushes(&small));
    for i in 0..8u64 {
        assert!(pread(&small, fd, 8000 * i, 4000) == model(&want, 8000 * i, 4000));
    }
    // Reads 0, 1 plain; 2 fetches 2..6 (16 KiB: 4 records), 6 fetches 6..10.
    assert_eq!(
        (server_reads(&small) - before.0, pushes(&small) - before.1),
        (4, 0)
    );
    small.close(fd).unwrap();
}

/// Sum over the servers of their `shm_reads` counter (reads whose data
/// they placed in a client's landing area).
fn server_landings(c: &Client) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).shm_reads)
        .sum()
}

/// Records fetched ahead from servers on this host are placed by them in
/// the client's landing area (shared memory: no copy through the socket),
/// one request per window as before; not with `CHFS_CMA=0`, nor over TCP.
#[test]
fn records_from_local_servers_land_in_shared_memory() {
    let p = LocalPool::start(2).expect("pool");
    let w = client(&p, |_| {});
    let want = make_file(&w, "/hard", 16 << 20, 47008 * 4 * 80, &[]);
    let on = client(&p, |c| c.read_ahead = 1 << 20);
    let before = server_landings(&on);
    assert_eq!(hard_reads(&on, "/hard", &want, 46), (2 + 2, 2 + 2));
    // (The two plain reads that find the pattern land too.)
    assert_eq!(server_landings(&on) - before, 2 + 2);
    // 64 KiB chunks: a window's pieces from both servers, both landed
    // (and the parts of the two plain reads, 18-28 KB each).
    let before = server_landings(&on);
    records_of_64k_chunks_cost_a_request_per_server(&w, &on);
    assert_eq!(server_landings(&on) - before, 4 + 2);
    for (what, c) in [
        (
            "CHFS_CMA=0",
            client(&p, |c| {
                c.read_ahead = 1 << 20;
                c.cma = false;
            }),
        ),
        (
            "TCP",
            client(&p, |c| {
                c.read_ahead = 1 << 20;
                c.local_socket = false;
            }),
        ),
    ] {
        let before = server_landings(&c);
        assert_eq!(hard_reads(&c, "/hard", &want, 46), (2 + 2, 2 + 2), "{what}");
        assert_eq!(server_landings(&c) - before, 0, "{what}");
    }
    assert_eq!(on.stats().landing_lost, 0);
}

/// A window's read that times out gives its slot of the landing area up
/// for good (the server may still write it), and the server, once it
/// runs again, no longer writes it (past the request's deadline); later
/// windows land in other slots and give the right bytes.
#[test]
fn a_landing_read_that_times_out_gives_its_slot_up() {
    let p = LocalPool::start(2).expect("pool");
    let w = client(&p, |_| {});
    let want = make_file(&w, "/hard", 16 << 20, 47008 * 4 * 80, &[]);
    let c = client(&p, |c| {
        c.read_ahead = 1 << 20;
        c.rpc_timeout = Duration::from_millis(700);
    });
    let fd = c.open("/hard", libc::O_RDONLY, 0).unwrap();
    let rec = |i: u64| 47008 * (4 * i + 1);
    // Records 0 and 1 read plainly, 2..24 fetched ahead in one window:
    // all landed.
    for i in 0..24 {
        assert!(pread(&c, fd, rec(i), 47008) == model(&want, rec(i), 47008));
    }
    let landed = server_landings(&c);
    assert_eq!(landed, 3);
    for i in 0..2 {
        p.signal(i, libc::SIGSTOP).unwrap();
        let stat = format!("/proc/{}/stat", p.pid(i).unwrap());
        while !std::fs::read_to_string(&stat).unwrap().contains(") T ") {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // The next window's fetch times out, then the plain read does: two
    // slots given up.
    let mut b = vec![0u8; 47008];
    let e = c.pread(fd, &mut b, rec(24)).unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT, "{e}");
    assert_eq!(c.stats().landing_lost, 2);
    for i in 0..2 {
        p.signal(i, libc::SIGCONT).unwrap();
    }
    // (The stopped server's late answers come and go meanwhile.)
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server_landings(&c), landed);
    for i in 24..70 {
        assert!(
            pread(&c, fd, rec(i), 47008) == model(&want, rec(i), 47008),
            "record {i}"
        );
    }
    assert!(server_landings(&c) > landed);
    assert_eq!(c.stats().landing_lost, 2);
    c.close(fd).unwrap();
}

/// A read into the landing area whose connection drops while it waits
/// (the server closes it instead of serving the read:
/// `--test-drop-landings 1`) is not sent again on a new connection: the
/// read is done again the plain way, with the right bytes, and the read
/// after it lands again.
#[test]
fn a_landing_read_whose_connection_drops_is_read_again() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 1,
        args: vec!["--test-drop-landings".into(), "1".into()],
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |c| c.read_ahead = 0);
    let want = make_file(&c, "/small", 65536, 2 << 20, &[]);
    let fd = c.open("/small", libc::O_RDONLY, 0).unwrap();
    let reads = server_reads(&c);
    assert!(pread(&c, fd, 0, 1 << 20) == model(&want, 0, 1 << 20));
    // The dropped ReadSpans was never served; the plain read was.
    let again = server_reads(&c) - reads;
    assert!(again >= 1, "{again} reads served");
    // (Its slot is given up: the client cannot know that the server will
    // never write there.)
    assert_eq!(c.stats().landing_lost, 1);
    let landed = server_landings(&c);
    assert!(pread(&c, fd, 4096, 1 << 20) == model(&want, 4096, 1 << 20));
    assert_eq!(server_landings(&c) - landed, 1, "landed again");
    c.close(fd).unwrap();
}

/// Plain reads (no read-ahead) of chunks of 16 KiB or more from servers
/// on this host come through the landing area too, placed one after the
/// other in at most 4 slots of 1 MiB per call (the rest through the
/// socket), or, for chunks of up to 256 KiB, one `ReadSpans` per server
/// into a slot each; the same bytes either way; small ones, and with
/// `CHFS_CMA=0` all, through the socket.
#[test]
fn plain_reads_from_local_servers_land_in_shared_memory() {
    let p = LocalPool::start(2).expect("pool");
    let c = client(&p, |c| c.read_ahead = 0);
    let want = make_file(&c, "/big", 1 << 20, 16 << 20, &[(5 << 20, 6 << 20)]);
    let small = make_file(&c, "/small", 65536, 8 << 20, &[(100_000, 300_000)]);
    let landed = |f: &dyn Fn()| {
        let before = server_landings(&c);
        f();
        server_landings(&c) - before
    };
    let fd = c.open("/big", libc::O_RDONLY, 0).unwrap();
    // 4 chunks of 1 MiB, one of them a hole: a slot each.
    assert_eq!(
        landed(&|| assert!(pread(&c, fd, 3 << 20, 4 << 20) == model(&want, 3 << 20, 4 << 20))),
        4
    );
    // 16 chunks and a bit: 4 landed, the rest through the socket.
    assert_eq!(
        landed(&|| assert!(pread(&c, fd, 100, 16 << 20) == model(&want, 100, 16 << 20))),
        4
    );
    // Small parts: through the socket.
    assert_eq!(
        landed(&|| {
            assert!(pread(&c, fd, (1 << 20) - 4000, 8000) == model(&want, (1 << 20) - 4000, 8000))
        }),
        0
    );
    c.close(fd).unwrap();
    // 64 KiB chunks: one `ReadSpans` per server for a 1 MiB read (each
    // into a slot); 8 MiB would take 8 slots, more than a read takes:
    // chunk by chunk then, 16 to a slot (64 of 128).
    let fd = c.open("/small", libc::O_RDONLY, 0).unwrap();
    let reads = server_reads(&c);
    assert_eq!(
        landed(&|| assert!(pread(&c, fd, 65536, 1 << 20) == model(&small, 65536, 1 << 20))),
        2
    );
    assert_eq!(server_reads(&c) - reads, 2);
    assert_eq!(landed(&|| assert!(pread(&c, fd, 0, 8 << 20) == small)), 64);
    c.close(fd).unwrap();
    let off = client(&p, |c| {
        c.read_ahead = 0;
        c.cma = false;
    });
    let fd = off.open("/big", libc::O_RDONLY, 0).unwrap();
    assert_eq!(landed(&|| assert!(pread(&off, fd, 0, 16 << 20) == want)), 0);
    off.close(fd).unwrap();
    assert_eq!(c.stats().landing_lost, 0);
}

/// Over a socket (TCP, or the Unix socket without the landing area), a
/// `pread` of several chunks of up to 256 KiB also goes as one
/// `ReadSpans` per server (of at most 1 MiB each), its data received into
/// a buffer and put in place: the bytes of plain reads, holes and the end
/// of the file included, with no landing.
#[test]
fn plain_reads_over_sockets_go_by_server() {
    let p = LocalPool::start(2).expect("pool");
    let w = client(&p, |_| {});
    let small = make_file(&w, "/small", 65536, 8 << 20, &[(100_000, 300_000)]);
    let tail = make_file(&w, "/tail", 65536, 1_000_000, &[(900_000, 950_000)]);
    for (name, tcp) in [("tcp", true), ("unix without the landing area", false)] {
        let c = client(&p, |c| {
            c.read_ahead = 0;
            c.cma = false;
            c.local_socket = !tcp;
        });
        let fd = c.open("/small", libc::O_RDONLY, 0).unwrap();
        let (reads, landings) = (server_reads(&c), server_landings(&c));
        // 16 chunks, 2 servers: one request each.
        assert!(
            pread(&c, fd, 65536 + 10, 1 << 20) == model(&small, 65536 + 10, 1 << 20),
            "{name}"
        );
        assert_eq!(server_reads(&c) - reads, 2, "{name}");
        // 8 MiB: at most 1 MiB per request, 8 MiB from 2 servers.
        let reads = server_reads(&c);
        assert!(pread(&c, fd, 0, 8 << 20) == small, "{name}");
        let n = server_reads(&c) - reads;
        assert!((8..=10).contains(&n), "{name}: {n} requests");
        assert_eq!(server_landings(&c) - landings, 0, "{name}");
        c.close(fd).unwrap();
        // Past the end: cut at the size, a hole before it.
        let fd = c.open("/tail", libc::O_RDONLY, 0).unwrap();
        assert!(
            pread(&c, fd, 800_000, 400_000) == model(&tail, 800_000, 400_000),
            "{name}"
        );
        c.close(fd).unwrap();
        if tcp {
            assert_eq!(c.local_connections().0, 0, "over TCP");
        }
    }
}

/// A small file's bytes come with its open (`CHFS_OPEN_DATA`,
/// `Request::StatData`): opening it, reading it whole (with a buffer of
/// any length, and again at its end) and closing it is one request, read-
/// only or read-write (as the C API opens), through a symbolic link too
/// (whose target comes with its entry, as for readlink);
/// a file of more than its first chunk, or larger than the setting, is
/// read as before; the bytes follow read-ahead's rules (this process's
/// writes seen at once, another's at the next open, or by a descriptor
/// already open once they are a second old), and none come while the
/// setting or read-ahead is off.
#[test]
fn small_files_come_with_their_open() {
    let p = LocalPool::start(2).expect("pool");
    let c = client(&p, |_| {});
    assert_eq!(c.config().open_data, 64 << 10, "the default");
    let cs = chfs_proto::DEFAULT_CHUNK_SIZE as usize;
    // (name, size, holes): one of mdtest-hard's files, a chunk's worth,
    // one whose end is a hole, one of two chunks, an empty one.
    let files = [
        ("/a", 3901, vec![]),
        ("/b", cs, vec![]),
        ("/c", 5000, vec![(100, 5000)]),
        ("/d", 300, vec![(0, 200)]),
        ("/e", cs + 1, vec![]),
        ("/z", 0, vec![]),
    ];
    let mut wants = Vec::new();
    for (name, size, holes) in &files {
        wants.push(make_file(&c, name, cs as u32, *size, holes));
    }
    c.symlink("/a", "/l").unwrap();
    // Requests to open, read whole (twice: the second at the end) and
    // close, and the bytes read.
    let read_whole = |c: &Client, name: &str, flags: i32| {
        let sent = c.stats().rpcs;
        let fd = c.open(name, flags, 0).unwrap();
        let mut buf = vec![0xa5u8; 1 << 20];
        let n = c.read(fd, &mut buf).unwrap();
        assert_eq!(c.read(fd, &mut buf[n..]).unwrap(), 0, "{name}: at its end");
        c.close(fd).unwrap();
        buf.truncate(n);
        (c.stats().rpcs - sent, buf)
    };
    for ((name, size, _), want) in files.iter().zip(&wants) {
        for flags in [libc::O_RDONLY, libc::O_RDWR] {
            let (rpcs, got) = read_whole(&c, name, flags);
            assert!(got == *want, "{name}, flags {flags}: other bytes");
            match *size {
                s if s <= cs => assert_eq!(rpcs, 1, "{name}, flags {flags}"),
                _ => assert!(rpcs >= 3, "{name}: {rpcs}"),
            }
        }
    }
    let (rpcs, got) = read_whole(&c, "/l", libc::O_RDONLY);
    assert!(got == wants[0]);
    assert_eq!(
        rpcs, 2,
        "the link's entry with its target, then the file's with its bytes"
    );
    let sent = c.stats().rpcs;
    assert_eq!(c.readlink("/l").unwrap(), "/a");
    assert_eq!(
        c.stats().rpcs - sent,
        1,
        "readlink: the entry with its target"
    );

    // A write-only open asks for no bytes: the open alone is a request
    // (whose answer is checked to carry none by the server's reads).
    let reads = server_reads(&c);
    let sent = c.stats().rpcs;
    let fd = c.open("/a", libc::O_WRONLY, 0).unwrap();
    c.close(fd).unwrap();
    assert_eq!(c.stats().rpcs - sent, 1);
    assert_eq!(server_reads(&c), reads, "no chunk read for it");

    // This process's write through the descriptor, or by path: seen at
    // once.
    let fd = c.open("/a", libc::O_RDWR, 0).unwrap();
    c.pwrite(fd, b"xyz", 10).unwrap();
    let mut b = [0u8; 20];
    assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 20);
    assert_eq!(&b[10..13], b"xyz");
    c.close(fd).unwrap();
    let fd = c.open("/a", libc::O_RDONLY, 0).unwrap();
    c.truncate("/a", 12).unwrap();
    assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 12);
    c.close(fd).unwrap();

    // A write past the size through a descriptor still open (in a
    // second chunk: the size is published at its close), then a second
    // descriptor: its reads see the bytes, as plain reads do (fsx found
    // this).
    let w = c
        .open_chunk_size("/w", libc::O_CREAT | libc::O_RDWR, 0o644, 4096)
        .unwrap();
    c.pwrite(w, b"12345678", 12288).unwrap();
    let r = c.open("/w", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 5];
    assert_eq!(c.pread(r, &mut b, 12288).unwrap(), 5);
    assert_eq!(&b, b"12345");
    c.close(r).unwrap();
    c.close(w).unwrap();

    // Another process's write: at the next open; by a descriptor already
    // open once its bytes are a second old.
    let other = client(&p, |_| {});
    let fd = c.open("/b", libc::O_RDONLY, 0).unwrap();
    let ofd = other.open("/b", libc::O_WRONLY, 0).unwrap();
    other.pwrite(ofd, b"new", 0).unwrap();
    other.close(ofd).unwrap();
    let fresh = c.open("/b", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 3];
    c.pread(fresh, &mut b, 0).unwrap();
    assert_eq!(&b, b"new");
    c.pread(fd, &mut b, 0).unwrap();
    assert_eq!(&b[..], &wants[1][..3], "within the second: as at the open");
    std::thread::sleep(Duration::from_millis(1100));
    c.pread(fd, &mut b, 0).unwrap();
    assert_eq!(&b, b"new");
    c.close(fd).unwrap();
    c.close(fresh).unwrap();

    // Off: an open and a read are a request each.
    for off in [
        client(&p, |c| c.open_data = 0),
        client(&p, |c| c.read_ahead = 0),
    ] {
        let (rpcs, got) = read_whole(&off, "/d", libc::O_RDONLY);
        assert!(got == wants[3]);
        assert!(rpcs >= 2, "{rpcs}");
    }
}

/// Servers that do not know `StatData` (an older chfsd): the open that
/// asked is answered by a plain lookup, and later opens ask for the entry
/// alone; the bytes read are the file's.
#[test]
fn servers_without_stat_data_are_asked_for_the_entry() {
    let p = LocalPool::start_with(PoolOptions {
        servers: 2,
        args: vec!["--unknown-op".into(), "STAT_DATA".into()],
        ..Default::default()
    })
    .expect("pool");
    let c = client(&p, |_| {});
    let want = make_file(&c, "/s", 65536, 3901, &[]);
    for round in 0..3 {
        let sent = c.stats().rpcs;
        let fd = c.open("/s", libc::O_RDONLY, 0).unwrap();
        assert!(pread(&c, fd, 0, 4096) == want, "round {round}");
        c.close(fd).unwrap();
        let rpcs = c.stats().rpcs - sent;
        // The refused StatData, the lookup, the read (and the read that
        // found the end: whether the file grew); then no StatData.
        assert_eq!(rpcs, if round == 0 { 4 } else { 3 }, "round {round}");
    }
}

/// A pool with one server that does not know `StatData` among others
/// that do: the older one is remembered by address (its files' opens ask
/// it for the entry alone), and the others' files still come with their
/// open. (Before, the first refusal turned it off for every server.)
#[test]
fn one_older_server_costs_only_its_own_files_their_bytes() {
    let mut p = LocalPool::start_with(PoolOptions {
        servers: 1,
        args: vec!["--unknown-op".into(), "STAT_DATA".into()],
        ..Default::default()
    })
    .expect("pool");
    p.set_args(Vec::new());
    p.add_server().expect("a second server");
    let c = client(&p, |_| {});
    let names: Vec<String> = (0..32).map(|i| format!("/f{i}")).collect();
    let wants: Vec<Vec<u8>> = names
        .iter()
        .map(|n| make_file(&c, n, 65536, 3901, &[]))
        .collect();
    let open_read = |round: usize| -> Vec<u64> {
        names
            .iter()
            .zip(&wants)
            .map(|(n, want)| {
                let sent = c.stats().rpcs;
                let fd = c.open(n, libc::O_RDONLY, 0).unwrap();
                assert!(pread(&c, fd, 0, 4096) == *want, "{n}, round {round}");
                c.close(fd).unwrap();
                c.stats().rpcs - sent
            })
            .collect()
    };
    // The first round: one refusal (4 requests for that file) at most.
    let first = open_read(0);
    assert_eq!(first.iter().filter(|&&n| n == 4).count(), 1, "{first:?}");
    // Then the older server's files cost the lookup, the read and the
    // read that found the end; the other's one request each.
    for round in 1..3 {
        let rpcs = open_read(round);
        assert!(rpcs.iter().all(|&n| n == 1 || n == 3), "{rpcs:?}");
        let with = rpcs.iter().filter(|&&n| n == 1).count();
        assert!(with > 0 && with < names.len(), "{rpcs:?}");
        for (i, (&a, &b)) in first.iter().zip(&rpcs).enumerate() {
            assert!(
                a == b || (a, b) == (4, 3),
                "file {i}: {first:?} then {rpcs:?}"
            );
        }
    }
}

/// Over `ofi+tcp` too, a small file's bytes come with its open: in the
/// answer's message up to 64 KiB, and (a larger `CHFS_OPEN_DATA` with
/// larger chunks) an answer longer than a message, lent by the server for
/// the client to pull.
#[test]
fn small_files_come_with_their_open_over_ofi_tcp() {
    let Some(p) = fabric_pool(2, "small_files_come_with_their_open_over_ofi_tcp") else {
        return;
    };
    let secret = p.secret().unwrap().as_bytes().to_vec();
    let c = client(&p, |c| {
        c.secret = secret.clone();
        c.open_data = 1 << 20;
    });
    for (name, cs, size) in [
        ("/a", 65536u32, 3901usize),
        ("/b", 65536, 65536),
        ("/c", 1 << 20, 300_000),
        ("/d", 1 << 20, 1 << 20),
    ] {
        let want = make_file(&c, name, cs, size, &[(10, 20)]);
        let sent = c.stats().rpcs;
        let fd = c.open(name, libc::O_RDONLY, 0).unwrap();
        let got = pread(&c, fd, 0, size + 10);
        c.close(fd).unwrap();
        assert!(got == want, "{name}");
        assert_eq!(c.stats().rpcs - sent, 1, "{name}");
    }
}
