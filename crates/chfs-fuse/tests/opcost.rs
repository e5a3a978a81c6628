//! What one metadata operation costs through a real mount (issue 25):
//! requests the servers see, and how the serving threads are scheduled.

mod common;

use std::fs;
use std::io::ErrorKind;

use common::*;

/// The transport chfuse reported when it mounted.
fn transport(m: &Mount) -> String {
    let log = fs::read_to_string(&m.log).unwrap_or_default();
    let line = log.lines().find(|l| l.contains("mounted")).unwrap_or("");
    line.split("transport=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("")
        .trim_matches('"')
        .to_string()
}

fn client_of(pool: &LocalPool) -> chfs_client::Client {
    chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap()
}

/// Requests the pool's servers have served so far.
fn requests(admin: &chfs_client::Client) -> u64 {
    admin
        .server_status()
        .into_iter()
        .map(|(_, s)| s.unwrap().requests)
        .sum()
}

fn missing(p: &std::path::Path) -> bool {
    matches!(fs::metadata(p), Err(e) if e.kind() == ErrorKind::NotFound)
}

/// A name found missing is kept by the kernel as a negative entry for the
/// negative timeout: asking again reaches neither chfuse nor a server,
/// and creating the name through the mount is seen at once.
fn missing_names_are_asked_for_once(args: &[&str]) {
    let pool = pool(1);
    let admin = client_of(&pool);
    // Made by another client: the mount has no listing of it, so each
    // lookup of a missing name in it asks the server (until the
    // directory is listed after a few).
    admin.mkdir("/d", 0o755).unwrap();
    let mut all = vec!["--negative-timeout", "60", "--entry-timeout", "60"];
    all.extend_from_slice(args);
    let m = Mount::new(&pool, &all);
    assert!(missing(&m.p("d/x")));
    let r0 = requests(&admin);
    let r1 = requests(&admin);
    let status = r1 - r0;
    for _ in 0..20 {
        assert!(missing(&m.p("d/x")));
    }
    let r2 = requests(&admin);
    // Without negative entries the 20 lookups send 8 requests (7 lookups,
    // then a listing of the directory); 2 of slack for anything else the
    // mount might send meanwhile.
    let extra = (r2 - r1).saturating_sub(status);
    assert!(
        extra <= 2,
        "{extra} requests for 20 lookups of a name already found missing"
    );
    // This mount's own changes replace the negative entry at once.
    fs::write(m.p("d/x"), b"here").unwrap();
    assert_eq!(fs::read(m.p("d/x")).unwrap(), b"here");
    assert!(missing(&m.p("d/sub")));
    fs::create_dir(m.p("d/sub")).unwrap();
    assert!(m.p("d/sub").is_dir());
    assert!(missing(&m.p("d/moved")));
    fs::rename(m.p("d/x"), m.p("d/moved")).unwrap();
    assert_eq!(fs::read(m.p("d/moved")).unwrap(), b"here");
    assert!(missing(&m.p("d/x")));
    fs::remove_file(m.p("d/moved")).unwrap();
    assert!(missing(&m.p("d/moved")));
    fs::write(m.p("d/moved"), b"again").unwrap();
    assert_eq!(fs::read(m.p("d/moved")).unwrap(), b"again");
    // A symbolic link, and a directory renamed onto a missing name.
    assert!(missing(&m.p("d/link")));
    std::os::unix::fs::symlink("moved", m.p("d/link")).unwrap();
    assert_eq!(fs::read(m.p("d/link")).unwrap(), b"again");
    assert!(missing(&m.p("d/sub2")));
    fs::rename(m.p("d/sub"), m.p("d/sub2")).unwrap();
    assert!(m.p("d/sub2").is_dir());
    assert!(missing(&m.p("d/sub")));
}

#[test]
fn missing_names_are_asked_for_once_over_io_uring() {
    missing_names_are_asked_for_once(&[]);
}

#[test]
fn missing_names_are_asked_for_once_over_dev_fuse() {
    missing_names_are_asked_for_once(&["--io-uring=false"]);
}

#[test]
fn without_a_negative_timeout_missing_names_are_asked_for_every_time() {
    let pool = pool(1);
    let admin = client_of(&pool);
    admin.mkdir("/d", 0o755).unwrap();
    let m = Mount::new(&pool, &["--negative-timeout", "0"]);
    assert!(missing(&m.p("d/x")));
    let fd = admin
        .create("/d/x", chfs_client::flags::O_WRONLY, 0o644)
        .unwrap();
    admin.close(fd).unwrap();
    assert!(m.p("d/x").exists(), "another client's file is seen at once");
}

/// The ring threads run with SCHED_BATCH, so that a request the kernel
/// does not wait for (the RELEASE of close(2), the FORGET after an
/// unlink) does not preempt the process that sent it.
#[test]
fn ring_threads_do_not_preempt_the_processes_they_serve() {
    let pool = pool(1);
    let m = Mount::new(&pool, &[]);
    if transport(&m) != "io_uring" {
        chfs_localpool::skip(
            "uring",
            "ring_threads_do_not_preempt_the_processes_they_serve",
            "no FUSE over io_uring here: no ring threads",
        );
        return;
    }
    fs::write(m.p("f"), b"x").unwrap();
    let mut rings = 0;
    for t in fs::read_dir(format!("/proc/{}/task", m.pid())).unwrap() {
        let t = t.unwrap();
        let comm = fs::read_to_string(t.path().join("comm")).unwrap();
        // The ring threads, and the /dev/fuse threads, which read only
        // FORGET (sent after each unlink) and INTERRUPT while rings serve.
        if !comm.starts_with("chfuse-q") && !comm.starts_with("fuser-") {
            continue;
        }
        let tid: i32 = t.file_name().to_str().unwrap().parse().unwrap();
        // SAFETY: plain syscall on a thread id; no memory.
        let policy = unsafe { libc::sched_getscheduler(tid) };
        assert_eq!(policy, libc::SCHED_BATCH, "{} ({tid})", comm.trim());
        rings += 1;
    }
    assert!(rings > 0, "no ring threads found");
}

/// Kernel requests chfuse has served so far, by opcode name: asks the
/// daemon (SIGUSR1, by its PID) to log its counts and reads them back.
fn kernel_requests(m: &Mount) -> std::collections::HashMap<String, u64> {
    const LINE: &str = "kernel requests served";
    // Complete lines only (a line being written has no newline yet).
    let lines = |m: &Mount| -> Vec<String> {
        fs::read_to_string(&m.log)
            .unwrap_or_default()
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n') && l.contains(LINE))
            .map(str::to_string)
            .collect()
    };
    let before = lines(m).len();
    // SAFETY: plain syscall on the PID of the chfuse this test started.
    assert_eq!(unsafe { libc::kill(m.pid() as i32, libc::SIGUSR1) }, 0);
    let t = std::time::Instant::now();
    let line = loop {
        if let Some(l) = lines(m).get(before) {
            break l.clone();
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "chfuse logged no request counts after SIGUSR1"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let counts = line.split("requests=").nth(1).unwrap_or("");
    counts
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Requests with each opcode name served between two counts.
fn delta(
    a: &std::collections::HashMap<String, u64>,
    b: &std::collections::HashMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    b.iter()
        .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn get(d: &std::collections::BTreeMap<String, u64>, op: &str) -> u64 {
    d.get(op).copied().unwrap_or(0)
}

/// The counts once chfuse has served `want` requests with opcode `op` in
/// all: waits for those the kernel sends without waiting for a reply (the
/// RELEASE of close(2), the FORGET after an unlink).
fn settled(m: &Mount, op: &str, want: u64) -> std::collections::HashMap<String, u64> {
    let t = std::time::Instant::now();
    loop {
        let c = kernel_requests(m);
        if c.get(op).copied().unwrap_or(0) >= want
            || t.elapsed() > std::time::Duration::from_secs(5)
        {
            return c;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn create(p: &std::path::Path, excl: bool) {
    let mut o = fs::OpenOptions::new();
    o.write(true);
    if excl {
        o.create_new(true);
    } else {
        o.create(true);
    }
    drop(o.open(p).unwrap());
}

const N: u64 = 40;

/// What open(O_CREAT)+close and unlink cost in kernel requests on this
/// kernel (Linux 6.18), counted by chfuse. With `default_permissions` the
/// kernel marks a directory's mode/uid/gid stale after every create or
/// remove in it (fuse_dir_changed invalidates STATX_BASIC_STATS) and
/// fetches them (GETATTR) for the permission check of the next path walk
/// through it, however long the attribute timeout; a new name is looked
/// up (LOOKUP) before its CREATE; close(2) sends RELEASE, an unlinked
/// inode a FORGET. Within the entry timeout an unlink sends no LOOKUP.
fn create_and_unlink_cost(args: &[&str], default_permissions: bool) {
    let pool = pool(1);
    let mut all = vec![
        "--attr-timeout",
        "60",
        "--entry-timeout",
        "60",
        "--negative-timeout",
        "60",
    ];
    all.extend_from_slice(args);
    let m = Mount::new(&pool, &all);
    fs::create_dir(m.p("d")).unwrap();
    create(&m.p("d/warm"), false);
    let a = settled(&m, "RELEASE", 1);
    for i in 0..N {
        create(&m.p(&format!("d/f{i}")), false);
    }
    let b = settled(&m, "RELEASE", N + 1);
    let c = delta(&a, &b);
    let getattrs = if default_permissions { N } else { 0 };
    assert_eq!(get(&c, "CREATE"), N, "{c:?}");
    assert_eq!(get(&c, "LOOKUP"), N, "{c:?}");
    assert_eq!(get(&c, "RELEASE"), N, "{c:?}");
    assert_eq!(get(&c, "GETATTR"), getattrs, "{c:?}");
    assert_eq!(c.values().sum::<u64>(), 3 * N + getattrs, "{c:?}");
    for i in 0..N {
        fs::remove_file(m.p(&format!("d/f{i}"))).unwrap();
    }
    let forgets0 = b.get("FORGET").copied().unwrap_or(0);
    let u = delta(&b, &settled(&m, "FORGET", forgets0 + N));
    assert_eq!(get(&u, "UNLINK"), N, "{u:?}");
    assert_eq!(get(&u, "LOOKUP"), 0, "{u:?}");
    assert_eq!(get(&u, "GETATTR"), getattrs, "{u:?}");
    assert_eq!(get(&u, "FORGET"), N, "{u:?}");
    assert_eq!(u.values().sum::<u64>(), 2 * N + getattrs, "{u:?}");
    for i in 0..N {
        assert!(missing(&m.p(&format!("d/f{i}"))));
    }
}

#[test]
fn create_and_unlink_cost_over_io_uring() {
    create_and_unlink_cost(&[], true);
}

#[test]
fn create_and_unlink_cost_over_dev_fuse() {
    create_and_unlink_cost(&["--io-uring=false"], true);
}

#[test]
fn without_default_permissions_the_directory_is_not_fetched_again() {
    create_and_unlink_cost(&["-o", "nodefault_permissions"], false);
}

/// A name the kernel holds as a negative entry (looked up and found
/// missing within the negative timeout) is created without a LOOKUP: the
/// kernel revalidates the entry locally and sends CREATE at once. An
/// exclusive create (O_EXCL) still looks the name up, and so does a
/// create once the negative entry has expired or without negative
/// entries. Nothing can put negative entries in the kernel but a LOOKUP
/// of that name, so mdtest's creates of new names each need one.
fn names_found_missing_cost(args: &[&str], negative: bool) {
    let pool = pool(1);
    let neg = if negative { "60" } else { "0" };
    let mut all = vec!["--entry-timeout", "60", "--negative-timeout", neg];
    all.extend_from_slice(args);
    let m = Mount::new(&pool, &all);
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..2 * N {
        assert!(missing(&m.p(&format!("d/f{i}"))));
    }
    for (k, (range, excl)) in [(0..N, false), (N..2 * N, true)].into_iter().enumerate() {
        let a = settled(&m, "RELEASE", k as u64 * N);
        for i in range {
            create(&m.p(&format!("d/f{i}")), excl);
        }
        let c = delta(&a, &kernel_requests(&m));
        assert_eq!(get(&c, "CREATE"), N, "{c:?}");
        let lookups = if negative && !excl { 0 } else { N };
        assert_eq!(get(&c, "LOOKUP"), lookups, "excl {excl}: {c:?}");
    }
    for i in 0..2 * N {
        assert!(m.p(&format!("d/f{i}")).is_file());
    }
}

#[test]
fn names_found_missing_are_created_without_a_lookup() {
    names_found_missing_cost(&[], true);
}

#[test]
fn names_found_missing_are_created_without_a_lookup_over_dev_fuse() {
    names_found_missing_cost(&["--io-uring=false"], true);
}

#[test]
fn without_negative_entries_every_create_looks_the_name_up() {
    names_found_missing_cost(&[], false);
}

/// A file made through the mount in a directory far larger than a lookup
/// snapshot of a listing may be (65,536 names) costs one request: the
/// kernel's LOOKUP of the new name is answered by the snapshot, kept
/// ttl after ttl by the servers' directory versions (one request per
/// server and ttl), and the CREATE is the one request. Before, the
/// directory was too large to keep and each LOOKUP went to its server.
#[test]
fn creates_in_a_large_directory_cost_one_request_each() {
    let pool = pool(2);
    let admin = client_of(&pool);
    admin.mkdir("/big", 0o755).unwrap();
    let n = 65536 + 200;
    std::thread::scope(|s| {
        for t in 0..4 {
            let admin = &admin;
            s.spawn(move || {
                for i in (t..n).step_by(4) {
                    admin
                        .mknod(&format!("/big/old{i}"), libc::S_IFREG | 0o644, 0)
                        .unwrap();
                }
            });
        }
    });
    let ttl = std::time::Duration::from_millis(300);
    let m = Mount::new(
        &pool,
        &["--negative-timeout", "0.3", "--entry-timeout", "0.3"],
    );
    // Lookups of missing names until the directory is listed (before,
    // never: too large).
    for i in 0..50 {
        // (a burst: the directory is listed after 8 lookups within ttl)
        for j in 0..10 {
            assert!(missing(&m.p(&format!("big/burst{i}.{j}"))));
        }
        let r = requests(&admin);
        assert!(missing(&m.p(&format!("big/warm{i}"))));
        let r2 = requests(&admin);
        let r3 = requests(&admin);
        if r2 - r <= r3 - r2 {
            break;
        }
    }
    let r0 = requests(&admin);
    let status = requests(&admin) - r0;
    let r1 = requests(&admin);
    let (creates, t) = (300, std::time::Instant::now());
    for i in 0..creates {
        fs::File::create(m.p(&format!("big/new{i}"))).unwrap();
        if i % 100 == 99 {
            // Past the ttl: the snapshot is checked, not relisted.
            std::thread::sleep(ttl);
        }
    }
    let ttls = (t.elapsed().as_millis() / ttl.as_millis()) as u64 + 1;
    let sent = requests(&admin) - r1 - status;
    // One create each, a check (2 servers) and a parent lookup per ttl.
    assert!(
        sent <= creates + 3 * ttls + 4,
        "{sent} requests for {creates} creates over {ttls} ttls"
    );
    // Each file is there, and another client's is found within ttl.
    assert_eq!(admin.readdir("/big").unwrap().len(), n + creates as usize);
    admin
        .mknod("/big/foreign", libc::S_IFREG | 0o644, 0)
        .unwrap();
    let t = std::time::Instant::now();
    while missing(&m.p("big/foreign")) {
        assert!(t.elapsed() < ttl * 2 + std::time::Duration::from_millis(500));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
