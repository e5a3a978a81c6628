//! chfsd's heap: on transparent huge pages with `--huge-pages on` (the
//! server starts itself again with glibc's hugetlb tunable, keeps its
//! name and process id, and the chunk data it stores lands on 2 MiB pages
//! where the kernel offers them; off by default); what removed chunks
//! freed is kept for the next writes while requests come, and given back
//! once idle.

use bytes::Bytes;
use chfs_localpool::{LocalPool, PoolOptions};
use chfs_proto::msg::RemoveKind;
use chfs_proto::{Meta, Request, Response};
use std::time::{Duration, Instant};

mod common;
use common::{call, hello, rss_kib, status};

fn mem_pool(args: &[&str]) -> LocalPool {
    LocalPool::start_with(PoolOptions {
        servers: 1,
        args: args.iter().map(|s| s.to_string()).collect(),
        store: Some("mem".into()),
        chfsd: Some(env!("CARGO_BIN_EXE_chfsd").into()),
        ..Default::default()
    })
    .unwrap()
}

/// The process's GLIBC_TUNABLES, if set.
fn tunables(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    env.split(|&b| b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| v.strip_prefix("GLIBC_TUNABLES=").map(str::to_string))
}

/// A field of /proc/PID/smaps_rollup, in KiB.
fn rollup_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in smaps_rollup of {pid}"))
}

/// Whether the kernel gives transparent huge pages to a process that asks
/// (madvise) or to every one (always).
fn thp_offered() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

/// Stores `mib` files of one 1 MiB chunk each.
fn store_mib(addr: &str, mib: u64) {
    let (mut s, _, _) = hello(addr, b"");
    let meta = Meta {
        mode: libc::S_IFREG | 0o644,
        chunk_size: 1 << 20,
        ..Default::default()
    };
    for i in 0..mib {
        let r = call(
            &mut s,
            i + 1,
            &Request::Create {
                path: format!("/f{i}"),
                meta: Meta {
                    fileid: i as u32 + 1,
                    ..meta
                },
                excl: true,
                data: Bytes::from(vec![i as u8 | 1; 1 << 20]),
            },
        );
        assert!(
            matches!(r, Ok(Response::Created { created: true, .. })),
            "file {i}: {r:?}"
        );
    }
}

#[test]
fn chunk_data_lands_on_huge_pages_with_huge_pages_on() {
    let p = mem_pool(&["--huge-pages", "on"]);
    let pid = p.pid(0).unwrap();
    let t = tunables(pid).unwrap_or_default();
    assert!(
        t.split(':').any(|x| x == "glibc.malloc.hugetlb=1"),
        "GLIBC_TUNABLES of chfsd: {t:?}"
    );
    // Started again in place: the recorded pid serves, under its name.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "chfsd");
    store_mib(&p.addrs()[0], 64);
    let huge = rollup_kib(pid, "AnonHugePages:");
    if thp_offered() {
        assert!(huge >= 32 << 10, "64 MiB stored, {huge} KiB on huge pages");
    } else {
        eprintln!("transparent huge pages are off in this kernel: only the tunable was checked");
    }
    p.stop();
}

#[test]
fn by_default_the_heap_stays_on_small_pages() {
    let p = mem_pool(&[]);
    let pid = p.pid(0).unwrap();
    let t = tunables(pid).unwrap_or_default();
    assert!(!t.contains("glibc.malloc.hugetlb"), "GLIBC_TUNABLES: {t:?}");
    store_mib(&p.addrs()[0], 64);
    // (Transparent huge pages in `always` mode would give them anyway.)
    let always = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]"));
    if !always {
        assert_eq!(rollup_kib(pid, "AnonHugePages:"), 0);
    }
    p.stop();
}

#[test]
fn memory_of_removed_chunks_goes_back_once_the_server_is_idle() {
    // (The idle time is chfsd's `heap::IDLE`, 2 s.)
    let p = mem_pool(&[]);
    let pid = p.pid(0).unwrap();
    let addr = &p.addrs()[0];
    // 128 files, then 8 more that stay: the memory of the first is within
    // the heap, below data still stored (glibc alone never gives that
    // back, only its heap's top).
    store_mib(addr, 136);
    let full = rss_kib(pid);
    let (mut s, _, _) = hello(addr, b"");
    for i in 0..128u64 {
        let r = call(
            &mut s,
            1000 + i,
            &Request::RemoveEntry {
                path: format!("/f{i}"),
                kind: RemoveKind::NotDir,
            },
        );
        assert!(r.is_ok(), "remove /f{i}: {r:?}");
    }
    // Right after the removals the heap keeps the memory (for the next
    // writes: no fresh pages to fault in)...
    let kept = rss_kib(pid);
    assert!(
        kept + (64 << 10) > full,
        "136 MiB stored: RSS {full} KiB, {kept} KiB just after 128 were removed"
    );
    // `status` says so (the server's RSS, what its heap holds free)...
    let st = status(addr);
    assert_eq!(st.heap_trims, 0);
    assert!(st.heap_free >= 96 << 20, "heap_free {}", st.heap_free);
    assert!(
        st.rss >> 10 >= kept / 2 && st.rss >> 10 <= kept * 2,
        "status rss {} B, /proc {kept} KiB",
        st.rss
    );
    // ...and gives it back once no request came for 2 s (nothing is sent
    // meanwhile: a request would count as activity).
    let t = Instant::now();
    let mut now = kept;
    while now + (96 << 10) > full && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        now = rss_kib(pid);
    }
    assert!(
        now + (96 << 10) <= full,
        "136 MiB stored, 128 removed: RSS {full} -> {kept} -> {now} KiB after {:?} idle",
        t.elapsed()
    );
    eprintln!(
        "RSS {full} -> {kept} -> {now} KiB, given back after {:?}",
        t.elapsed()
    );
    let st = status(addr);
    assert_eq!(st.heap_trims, 1);
    assert!(
        st.rss >> 10 <= now * 2,
        "status rss {} B, /proc {now} KiB",
        st.rss
    );
    drop(s);
    p.stop();
}
