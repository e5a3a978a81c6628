//! Ordinary tools and syscalls on a real mount of a real pool.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::time::Duration;

use common::*;

/// Builds a local tree with symlinks and odd names.
fn make_tree(root: &std::path::Path) {
    let odd = [
        "with space",
        "ünïcødé-名前",
        "-leading-dash",
        "quote'\"mark",
        "star*and?question",
        ".hidden",
    ];
    std::fs::create_dir_all(root.join("sub/deeper/deepest")).unwrap();
    for (i, n) in odd.iter().enumerate() {
        std::fs::write(root.join(n), pattern(1000 * i + 7, i as u64)).unwrap();
        std::fs::write(root.join("sub").join(n), pattern(300_000, 50 + i as u64)).unwrap();
    }
    std::fs::write(root.join("sub/deeper/deepest/empty"), b"").unwrap();
    std::fs::write(root.join("sub/deeper/big"), pattern(3 << 20, 99)).unwrap();
    std::os::unix::fs::symlink("sub/deeper/big", root.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", root.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("../with space", root.join("sub/link-up")).unwrap();
    std::fs::set_permissions(
        root.join("sub/deeper/big"),
        PermissionsExt::from_mode(0o640),
    )
    .unwrap();
}

#[test]
fn cp_tar_find_mv_rm_round_trips() {
    let pool = pool(3);
    let m = Mount::new(&pool, &[]);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src");
    make_tree(&src);

    // cp -r into the mount, then compare.
    sh(&format!("cp -a {} {}", q(&src), q(&m.p("copy"))));
    sh(&format!(
        "diff -r --no-dereference {} {}",
        q(&src),
        q(&m.p("copy"))
    ));

    // find lists the same tree (names, types).
    let list = |d: &std::path::Path| {
        let mut v: Vec<String> = sh(&format!("cd {} && find . -printf '%y %p %s\\n'", q(d)))
            .lines()
            .map(|l| {
                // Directory sizes differ between file systems.
                if l.starts_with("d ") {
                    l.rsplit_once(' ').unwrap().0.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(&src), list(&m.p("copy")));

    // tar c from local | tar x into the mount; tar c from the mount | tar x
    // back to local disk: identical, symlinks included.
    std::fs::create_dir(m.p("tarx")).unwrap();
    sh(&format!(
        "tar cf - -C {} . | tar xf - -C {}",
        q(&src),
        q(&m.p("tarx"))
    ));
    let back = local.path().join("back");
    std::fs::create_dir(&back).unwrap();
    sh(&format!(
        "tar cf {}/t.tar -C {} . && tar xf {}/t.tar -C {}",
        q(local.path()),
        q(&m.p("tarx")),
        q(local.path()),
        q(&back)
    ));
    sh(&format!(
        "diff -r --no-dereference {} {}",
        q(&src),
        q(&back)
    ));
    assert_eq!(
        std::fs::read_link(back.join("link-rel")).unwrap(),
        std::path::Path::new("sub/deeper/big")
    );
    assert_eq!(
        std::fs::metadata(back.join("sub/deeper/big"))
            .unwrap()
            .mode()
            & 0o777,
        0o640
    );

    // mv a whole tree, then rm -rf it.
    sh(&format!("mv {} {}", q(&m.p("copy")), q(&m.p("moved"))));
    assert!(!m.p("copy").exists());
    sh(&format!(
        "diff -r --no-dereference {} {}",
        q(&src),
        q(&m.p("moved"))
    ));
    sh(&format!("rm -rf {} {}", q(&m.p("moved")), q(&m.p("tarx"))));
    let left: Vec<_> = std::fs::read_dir(&m.mp).unwrap().collect();
    assert!(left.is_empty(), "left after rm -rf: {left:?}");
}

#[test]
fn dd_with_1mib_blocks() {
    let pool = pool(2);
    let m = Mount::new(&pool, &[]);
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src.bin");
    std::fs::write(&src, pattern(16 << 20, 5)).unwrap();
    sh(&format!(
        "dd if={} of={} bs=1M status=none && dd if={} of={}/back.bin bs=1M status=none",
        q(&src),
        q(&m.p("f.bin")),
        q(&m.p("f.bin")),
        q(local.path())
    ));
    sh(&format!("cmp {} {}/back.bin", q(&src), q(local.path())));
    assert_eq!(std::fs::metadata(m.p("f.bin")).unwrap().len(), 16 << 20);
    // Overwrite a middle block in place (conv=notrunc) and check it.
    sh(&format!(
        "dd if=/dev/zero of={} bs=1M seek=3 count=1 conv=notrunc status=none",
        q(&m.p("f.bin"))
    ));
    let got = std::fs::read(m.p("f.bin")).unwrap();
    let mut want = pattern(16 << 20, 5);
    want[3 << 20..4 << 20].fill(0);
    assert!(got == want, "in-place overwrite mismatch");
}

#[test]
fn stat_fields_chmod_chown_utimens() {
    let pool = pool(2);
    let m = Mount::new(&pool, &[]);
    let f = m.p("f");
    std::fs::write(&f, b"12345").unwrap();
    sh(&format!("chmod 640 {}", q(&f)));
    sh(&format!(
        "touch -m -d '2001-02-03 04:05:06.5 UTC' {}",
        q(&f)
    ));
    let out = sh(&format!("stat -c '%s %a %F %Y %h' {}", q(&f)));
    assert_eq!(out.trim(), "5 640 regular file 981173106 1");
    // UTIME_OMIT for mtime leaves it; atime changes.
    let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 7,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0);
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 7));
    assert_eq!((md.mtime(), md.mtime_nsec()), (981_173_106, 500_000_000));
    // UTIME_NOW sets mtime to about now.
    let ts = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: as above.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) };
    assert_eq!(r, 0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let md = std::fs::metadata(&f).unwrap();
    assert!(
        (md.mtime() - now).abs() < 5,
        "mtime {} vs now {now}",
        md.mtime()
    );
    assert_eq!(md.atime(), 1_000_000_000);
    if is_root() {
        sh(&format!("chown 1234:5678 {}", q(&f)));
        let md = std::fs::metadata(&f).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
    }
    // Other file types.
    std::fs::create_dir(m.p("d")).unwrap();
    std::os::unix::fs::symlink("f", m.p("l")).unwrap();
    sh(&format!("mkfifo {}", q(&m.p("fifo"))));
    let types = sh(&format!("cd {} && stat -c '%n %F' d l fifo", q(&m.mp)));
    assert_eq!(types, "d directory\nl symbolic link\nfifo fifo\n");
    // truncate grows with zeros and shrinks.
    sh(&format!("truncate -s 3000000 {}", q(&f)));
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 3_000_000);
    let data = std::fs::read(&f).unwrap();
    assert_eq!(&data[..5], b"12345");
    assert!(data[5..].iter().all(|&b| b == 0));
    sh(&format!("truncate -s 2 {}", q(&f)));
    assert_eq!(std::fs::read(&f).unwrap(), b"12");
    // statfs answers.
    sh(&format!("df {}", q(&m.mp)));
}

#[test]
fn permission_denied_for_another_uid() {
    if !is_root() {
        chfs_localpool::skip(
            "root",
            "permission_denied_for_another_uid",
            "needs root (to run a command as uid 65534)",
        );
        return;
    }
    let pool = pool(2);
    let m = Mount::new(&pool, &[]);
    let as_nobody = |cmd: &str| {
        sh_status(&format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c {}",
            q(std::path::Path::new(cmd))
        ))
    };
    std::fs::create_dir(m.p("private")).unwrap();
    std::fs::set_permissions(m.p("private"), PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(m.p("private/secret"), b"s").unwrap();
    std::fs::write(m.p("ro"), b"readonly").unwrap();
    std::fs::set_permissions(m.p("ro"), PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::create_dir(m.p("shared")).unwrap();
    std::fs::set_permissions(m.p("shared"), PermissionsExt::from_mode(0o777)).unwrap();

    let (ok, out) = as_nobody(&format!("cat {}", q(&m.p("private/secret"))));
    assert!(!ok && out.contains("Permission denied"), "{out}");
    let (ok, out) = as_nobody(&format!("ls {}", q(&m.p("private"))));
    assert!(!ok && out.contains("Permission denied"), "{out}");
    let (ok, out) = as_nobody(&format!("echo x >> {}", q(&m.p("ro"))));
    assert!(!ok && out.contains("Permission denied"), "{out}");
    let (ok, out) = as_nobody(&format!("cat {}", q(&m.p("ro"))));
    assert!(ok && out == "readonly", "{out}");
    let (ok, out) = as_nobody(&format!("chmod 777 {}", q(&m.p("ro"))));
    assert!(!ok && out.contains("not permitted"), "{out}");
    let (ok, out) = as_nobody(&format!("touch {}", q(&m.p("newfile"))));
    assert!(!ok && out.contains("Permission denied"), "{out}");
    // Entries created by another user belong to that user.
    let (ok, out) = as_nobody(&format!(
        "echo mine > {} && mkdir {}",
        q(&m.p("shared/f")),
        q(&m.p("shared/d"))
    ));
    assert!(ok, "{out}");
    for p in ["shared/f", "shared/d"] {
        let md = std::fs::metadata(m.p(p)).unwrap();
        assert_eq!((md.uid(), md.gid()), (65534, 65534), "{p}");
    }
    assert_eq!(std::fs::read(m.p("ro")).unwrap(), b"readonly");
}

/// Appends `n` records of `tag` through one mount, from a shell loop that
/// reopens with O_APPEND each time and from one long-lived descriptor.
fn appender(path: &std::path::Path, tag: &str, n: usize) -> std::process::Child {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "i=0; while [ $i -lt {n} ]; do printf '{tag}%05d\\n' $i >> {p}; i=$((i+1)); done; \
             exec 3>>{p}; i=0; while [ $i -lt {n} ]; do printf '{tag}%05d\\n' $((i+{n})) >&3; i=$((i+1)); done",
            p = q(path)
        ))
        .spawn()
        .unwrap()
}

fn check_appends(data: &str, tags: &[&str], n: usize) {
    let mut seen: std::collections::HashMap<&str, Vec<usize>> = Default::default();
    for l in data.lines() {
        assert_eq!(l.len(), 6, "torn record {l:?}");
        seen.entry(&l[..1])
            .or_default()
            .push(l[1..].parse().unwrap());
    }
    for t in tags {
        let mut v = seen.remove(t).unwrap_or_default();
        v.sort();
        assert_eq!(v, (0..2 * n).collect::<Vec<_>>(), "records of {t}");
    }
    assert!(seen.is_empty());
}

#[test]
fn o_append_from_two_processes_and_two_mounts() {
    let pool = pool(2);
    let a = Mount::new(&pool, &[]);
    let b = Mount::new(&pool, &[]);
    let n = 150;
    // Two processes on one mount.
    let mut p1 = appender(&a.p("log1"), "A", n);
    let mut p2 = appender(&a.p("log1"), "B", n);
    assert!(p1.wait().unwrap().success() && p2.wait().unwrap().success());
    check_appends(
        &std::fs::read_to_string(a.p("log1")).unwrap(),
        &["A", "B"],
        n,
    );
    // Two processes on two mounts (two nodes' view): still no lost or torn
    // records, because the servers place appends.
    let mut p1 = appender(&a.p("log2"), "C", n);
    let mut p2 = appender(&b.p("log2"), "D", n);
    assert!(p1.wait().unwrap().success() && p2.wait().unwrap().success());
    check_appends(
        &std::fs::read_to_string(b.p("log2")).unwrap(),
        &["C", "D"],
        n,
    );
}

#[test]
fn mmap_read_and_shared_write() {
    mmap_body(&[]);
}

#[test]
fn mmap_with_the_page_cache() {
    mmap_body(&["--page-cache"]);
}

fn mmap_body(args: &[&str]) {
    let pool = pool(2);
    let m = Mount::new(&pool, args);
    let data = pattern(300_000, 3);
    std::fs::write(m.p("f"), &data).unwrap();
    let f = std::fs::File::open(m.p("f")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: mapping a file we hold open, read-only, with its exact length.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is data.len() bytes long and stays mapped below.
    let got = unsafe { std::slice::from_raw_parts(p as *const u8, data.len()) }.to_vec();
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, data.len()) };
    assert!(got == data, "mmap read differs");

    // A shared writable mapping reaches the file after msync.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    // SAFETY: as above, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the first 4096 bytes are mapped writable.
    unsafe {
        std::ptr::write_bytes(p as *mut u8, b'Z', 100);
        assert_eq!(libc::msync(p, 4096, libc::MS_SYNC), 0);
        libc::munmap(p, 4096);
    }
    drop(f);
    let back = std::fs::read(m.p("f")).unwrap();
    assert!(back[..100].iter().all(|&b| b == b'Z'));
    assert_eq!(&back[100..], &data[100..]);
}

#[test]
fn second_mount_reads_what_the_first_wrote() {
    let pool = pool(3);
    let a = Mount::new(&pool, &[]);
    let b = Mount::new(&pool, &["--attr-timeout", "0", "--entry-timeout", "0"]);
    let data = pattern(5 << 20, 11);
    std::fs::create_dir(a.p("dir")).unwrap();
    std::fs::write(a.p("dir/f"), &data).unwrap();
    assert!(std::fs::read(b.p("dir/f")).unwrap() == data);
    // Overwrite and grow on A; B (no attribute caching) sees it at open.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.p("dir/f"))
        .unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    let mut got = Vec::new();
    std::fs::File::open(b.p("dir/f"))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got.len(), data.len() + 4);
    assert_eq!(&got[data.len()..], b"tail");
    // Removal on B is seen on A (after A's entry timeout).
    std::fs::remove_file(b.p("dir/f")).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(!a.p("dir/f").exists());
}

#[test]
fn rename_of_an_open_file_keeps_its_descriptor() {
    let pool = pool(2);
    let m = Mount::new(&pool, &[]);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .mode(0o644)
        .open(m.p("old"))
        .unwrap();
    f.write_all(b"before ").unwrap();
    std::fs::create_dir(m.p("d")).unwrap();
    std::fs::rename(m.p("old"), m.p("d/new")).unwrap();
    f.write_all(b"after").unwrap();
    drop(f);
    assert_eq!(std::fs::read(m.p("d/new")).unwrap(), b"before after");
    assert!(!m.p("old").exists());
    // A directory renamed while a file inside it is open.
    let mut f = std::fs::File::create(m.p("d/inner")).unwrap();
    std::fs::rename(m.p("d"), m.p("e")).unwrap();
    f.write_all(b"x").unwrap();
    drop(f);
    assert_eq!(std::fs::read(m.p("e/inner")).unwrap(), b"x");
}

/// The page-cache and write-back modes: data round trips, and a second
/// mount sees it after close.
#[test]
fn page_cache_and_writeback_modes() {
    let pool = pool(2);
    for mode in [&["--page-cache"][..], &["--writeback-cache"][..]] {
        let a = Mount::new(&pool, mode);
        let b = Mount::new(&pool, mode);
        let name = mode[0].trim_start_matches('-');
        let data = pattern(3 << 20, 21);
        // Small writes (gathered by the kernel in write-back mode).
        let mut f = std::fs::File::create(a.p(name)).unwrap();
        for c in data.chunks(4096) {
            f.write_all(c).unwrap();
        }
        drop(f);
        assert!(
            std::fs::read(a.p(name)).unwrap() == data,
            "{name}: same mount"
        );
        assert!(
            std::fs::read(b.p(name)).unwrap() == data,
            "{name}: other mount"
        );
        sh(&format!(
            "dd if={} of=/dev/null bs=1M status=none",
            q(&b.p(name))
        ));
    }
}

/// 1 MiB reads and writes reach the file system as single 1 MiB requests
/// (FUSE 3 `max_pages`), in the default direct-I/O mode.
#[test]
fn one_mib_requests_reach_the_file_system() {
    let pool = pool(2);
    let m = Mount::new_env(&pool, &[], &[("CHFUSE_LOG", "chfs_fuse::core=debug")]);
    sh(&format!(
        "dd if=/dev/zero of={f} bs=1M count=4 status=none && dd if={f} of=/dev/null bs=1M status=none",
        f = q(&m.p("big"))
    ));
    let log = std::fs::read_to_string(&m.log).unwrap();
    // Each in the span of its operation.
    let count = |what: &str| {
        let span = format!("fuse{{op=\"{what}\"}}");
        log.lines()
            .filter(|l| l.contains(&span) && l.contains("size=1048576"))
            .count()
    };
    assert_eq!(count("write"), 4, "1 MiB write requests in:\n{log}");
    // Four reads of data and dd's final read that finds the end.
    assert_eq!(count("read"), 5, "1 MiB read requests in:\n{log}");
}

/// Waits until `cond` holds, up to `limit`; returns how long it took.
fn within(limit: Duration, cond: impl Fn() -> bool) -> Option<Duration> {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn lookup_cache_shows_own_changes_at_once_and_others_within_the_timeout() {
    let pool = pool(3);
    let m = Mount::new(&pool, &["--entry-timeout", "1", "--attr-timeout", "1"]);
    let other = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .unwrap();
    // A directory made here starts with an empty snapshot: names created
    // through the mount are seen at once, with their current size.
    std::fs::create_dir(m.p("d")).unwrap();
    for i in 0..20 {
        assert!(!m.p(&format!("d/missing{i}")).exists());
    }
    std::fs::write(m.p("d/mine"), b"12345").unwrap();
    assert_eq!(std::fs::metadata(m.p("d/mine")).unwrap().len(), 5);
    std::fs::create_dir(m.p("d/sub")).unwrap();
    assert!(m.p("d/sub").is_dir());
    std::os::unix::fs::symlink("mine", m.p("d/link")).unwrap();
    assert_eq!(std::fs::read(m.p("d/link")).unwrap(), b"12345");
    std::fs::rename(m.p("d/mine"), m.p("d/renamed")).unwrap();
    assert!(!m.p("d/mine").exists());
    assert_eq!(std::fs::read(m.p("d/renamed")).unwrap(), b"12345");
    // Another client's new entry appears within the timeout (plus slack).
    let fd = other.create("/d/theirs", libc::O_WRONLY, 0o644).unwrap();
    other.write(fd, b"abc").unwrap();
    other.close(fd).unwrap();
    let seen = within(Duration::from_secs(4), || m.p("d/theirs").exists());
    assert!(seen.is_some(), "another client's file never became visible");
    // Its removal and growth elsewhere too (listed names are re-checked).
    let mut names: Vec<String> = std::fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["link", "renamed", "sub", "theirs"]);
    other.unlink("/d/renamed").unwrap();
    let gone = within(Duration::from_secs(4), || !m.p("d/renamed").exists());
    assert!(gone.is_some(), "a removal elsewhere was never seen");
    let fd = other
        .open("/d/theirs", libc::O_WRONLY | libc::O_APPEND, 0)
        .unwrap();
    other.write(fd, b"defg").unwrap();
    other.close(fd).unwrap();
    let grown = within(Duration::from_secs(4), || {
        std::fs::metadata(m.p("d/theirs")).map(|s| s.len()).ok() == Some(7)
    });
    assert!(grown.is_some(), "growth elsewhere was never seen");
    // Writing through the mount is seen at once by the next lookup here.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("d/theirs"))
        .unwrap();
    f.write_all(b"hij").unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(m.p("d/theirs")).unwrap().len(), 10);
    // With the negative timeout off, another client's entry is seen at once
    // (once the kernel's own entry for the name has expired).
    let strict = Mount::new(&pool, &["--negative-timeout", "0", "--entry-timeout", "0"]);
    std::fs::create_dir(strict.p("e")).unwrap();
    assert!(!strict.p("e/x").exists());
    other
        .create("/e/x", libc::O_WRONLY, 0o644)
        .map(|fd| other.close(fd))
        .unwrap()
        .unwrap();
    assert!(strict.p("e/x").exists());
}

#[test]
fn root_has_real_times_and_df_shows_free_space() {
    let pool = pool(2);
    let m = Mount::new(&pool, &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let root = std::fs::metadata(m.p("")).unwrap();
    assert!(
        (now - root.mtime()).abs() < 3600,
        "root mtime {} is not the servers' start time (now {now})",
        root.mtime()
    );
    std::fs::write(m.p("f"), pattern(1 << 20, 3)).unwrap();
    // Servers without a size limit: capacity is what their medium can take.
    let out = sh(&format!("df -P -B1 {}", q(&m.p(""))));
    let line = out.lines().nth(1).expect("df line");
    let cols: Vec<&str> = line.split_whitespace().collect();
    let (total, used, avail): (u64, u64, u64) = (
        cols[1].parse().unwrap(),
        cols[2].parse().unwrap(),
        cols[3].parse().unwrap(),
    );
    assert!(used >= 1 << 20, "df used {used}: {line}");
    assert!(avail > 0 && total > used, "df shows no free space: {line}");
}

/// MemAvailable of this host, in bytes.
fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn df_of_servers_without_a_size_shows_free_memory_per_server() {
    // Two DRAM servers without -s on this host (SEMANTICS.md, statfs / df).
    let pool = dram_pool(2, &[]);
    let m = Mount::new(&pool, &[]);
    std::fs::write(m.p("f"), pattern(3 << 20, 5)).unwrap();
    let c = std::ffi::CString::new(m.mp.to_str().unwrap()).unwrap();
    // SAFETY: statvfs is plain data filled by the call.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let before = mem_available();
    // SAFETY: valid path and out pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    let after = mem_available();
    let bs = s.f_frsize;
    let (size, free, avail) = (s.f_blocks * bs, s.f_bfree * bs, s.f_bavail * bs);
    // What is stored counts as used; the rest is what each server's medium
    // can still take, free memory, counted once per server.
    assert!(size - free >= 3 << 20, "used {}", size - free);
    assert!(size - free < 64 << 20, "used {}", size - free);
    assert_eq!(free, avail);
    let (lo, hi) = (before.min(after), before.max(after));
    assert!(
        avail > 2 * lo - lo / 5 && avail < 2 * hi + hi / 5,
        "available {avail}, 2 x MemAvailable {} .. {}",
        2 * lo,
        2 * hi
    );
    // Files: the entries stored plus the free blocks.
    assert!(s.f_files > s.f_ffree && s.f_ffree == s.f_bfree);
    // df agrees, far from 100 % used.
    let out = sh(&format!("df -P {} | tail -1", q(&m.mp)));
    let pct: u32 = out
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    assert!(pct < 50, "{out}");
}

/// The node-local area through the mount, with relayed lookups: tools
/// write, list and read files in `.nodelocal`; their chunks are all on the
/// chfsd of this host (the first), not one on the others; `mv` out of the
/// area copies (EXDEV), and lookups of the shared file went through a
/// contact server.
#[test]
fn node_local_area_and_relayed_lookups_through_the_mount() {
    let pool = pool(3);
    // (no negative lookup cache: names another client creates are looked
    // up at once)
    let m = Mount::new_env(
        &pool,
        &["--negative-timeout", "0"],
        &[("CHFS_LOOKUP_RELAY_GROUP", "3")],
    );
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .unwrap();
    let entries = || -> Vec<(u64, u64, u64)> {
        c.server_status()
            .into_iter()
            .map(|(_, s)| {
                let s = s.unwrap();
                (s.entries, s.node_local_entries, s.lookups)
            })
            .collect()
    };
    let before = entries();
    let area = m.p(".nodelocal");
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src.bin");
    std::fs::write(&src, pattern(300_000, 9)).unwrap();
    sh(&format!(
        "mkdir -p {a}/job && cp {s} {a}/job/in.bin && cmp {s} {a}/job/in.bin && ls {a}/job | grep -qx in.bin",
        a = q(&area),
        s = q(&src)
    ));
    let after = entries();
    // The directory and 5 chunks of 64 KiB, on server 0 only.
    assert_eq!(after[0].0 - before[0].0, 6, "{before:?} -> {after:?}");
    assert_eq!(after[0].1, 2, "{after:?}");
    for i in 1..3 {
        assert_eq!(after[i].0, before[i].0, "server {i}: {after:?}");
    }
    // Out of the area: mv copies across the EXDEV.
    sh(&format!(
        "mv {a}/job/in.bin {o} && cmp {s} {o} && test ! -e {a}/job/in.bin",
        a = q(&area),
        o = q(&m.p("out.bin")),
        s = q(&src)
    ));
    assert_eq!(entries()[0].1, 1, "only the directory is left");
    // Files another client made: the mount looks them up through its
    // contact server (those its contact does not own).
    for i in 0..10 {
        let fd = c
            .create(&format!("/shared{i}"), chfs_client::flags::O_WRONLY, 0o644)
            .unwrap();
        c.close(fd).unwrap();
        sh(&format!(
            "stat {} >/dev/null",
            q(&m.p(&format!("shared{i}")))
        ));
    }
    let looked: u64 = entries().iter().map(|e| e.2).sum();
    assert!(looked > 0, "{:?}", entries());
}
