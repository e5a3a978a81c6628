//! Cache mode: a pool in front of a backend directory.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chfs_client::flags::*;
use chfs_client::Client;
use common::*;

struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("chfs-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn cache_pool(backend: &Path, n: usize, extra: &[&str]) -> (LocalPool, Client) {
    let mut args = vec!["--backend".to_string(), backend.display().to_string()];
    if !extra.contains(&"--flush-idle-msec") {
        args.extend(["--flush-idle-msec".into(), "100".into()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = LocalPool::start_with(PoolOptions {
        servers: n,
        args,
        ..Default::default()
    })
    .unwrap();
    let c = client(&p, |c| c.chunk_size = 4096);
    (p, c)
}

fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let size = c.stat(path).unwrap().size as usize;
    let fd = c.open(path, O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; size + 10];
    let n = c.pread(fd, &mut buf, 0).unwrap();
    c.close(fd).unwrap();
    buf.truncate(n);
    buf
}

fn write_at(c: &Client, path: &str, flags: i32, data: &[u8], off: u64) {
    let fd = c.open(path, flags, 0o640).unwrap();
    assert_eq!(c.pwrite(fd, data, off).unwrap(), data.len());
    c.close(fd).unwrap();
}

/// A backend tree: files of several sizes (one sparse), a symlink, subdirs.
fn make_tree(b: &Path) -> Vec<(String, Vec<u8>)> {
    fs::create_dir_all(b.join("in/sub")).unwrap();
    let mut files = vec![
        ("/in/empty".to_string(), Vec::new()),
        ("/in/small".to_string(), pattern(100, 1)),
        ("/in/multi".to_string(), pattern(50_000, 2)),
        ("/in/sub/big".to_string(), pattern(300_000, 3)),
    ];
    let mut sparse = vec![0u8; 20_000];
    sparse[19_990..].copy_from_slice(&pattern(10, 4));
    files.push(("/in/sparse".to_string(), sparse));
    for (p, d) in &files {
        fs::write(b.join(&p[1..]), d).unwrap();
    }
    std::os::unix::fs::symlink("small", b.join("in/link")).unwrap();
    files
}

#[test]
fn read_through_and_merged_listing() {
    let t = Tmp::new("read");
    let files = make_tree(&t.0);
    let (_p, c) = cache_pool(&t.0, 3, &[]);
    for (p, d) in &files {
        assert_eq!(&read_all(&c, p), d, "{p}");
    }
    assert_eq!(c.readlink("/in/link").unwrap(), "small");
    assert_eq!(read_all(&c, "/in/link"), pattern(100, 1));
    assert!(c.stat("/in/sub").unwrap().is_dir());
    assert_eq!(c.stat("/nowhere").unwrap_err().errno(), libc::ENOENT);
    // A new file in the cache next to backend files: each name once.
    write_at(&c, "/in/new", O_CREAT | O_WRONLY, b"fresh", 0);
    let names: Vec<String> = c
        .readdir("/in")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["empty", "link", "multi", "new", "small", "sparse", "sub"]
    );
    // Once cached, the backend is not consulted again for the bytes.
    fs::write(t.0.join("in/small"), b"changed behind our back").unwrap();
    assert_eq!(read_all(&c, "/in/small"), pattern(100, 1));
}

#[test]
fn revalidation_sees_backend_changes() {
    let t = Tmp::new("reval");
    fs::write(t.0.join("f"), b"version one").unwrap();
    let (_p, c) = cache_pool(&t.0, 2, &["--revalidate"]);
    assert_eq!(read_all(&c, "/f"), b"version one");
    std::thread::sleep(Duration::from_millis(20));
    fs::write(t.0.join("f"), b"version two, longer").unwrap();
    assert_eq!(read_all(&c, "/f"), b"version two, longer");
}

#[test]
fn write_back_matches_the_model() {
    let t = Tmp::new("wb");
    let files = make_tree(&t.0);
    let (_p, c) = cache_pool(&t.0, 3, &[]);
    // Modify a cached file in its middle (the rest comes from the backend).
    let mut multi = files[2].1.clone();
    multi[10_000..10_500].copy_from_slice(&pattern(500, 9));
    write_at(&c, "/in/multi", O_WRONLY, &pattern(500, 9), 10_000);
    // New files and directories, one spanning many chunks.
    c.mkdir("/out", 0o750).unwrap();
    c.mkdir("/out/deep", 0o700).unwrap();
    let big = pattern(123_457, 5);
    write_at(&c, "/out/deep/result", O_CREAT | O_WRONLY, &big, 0);
    write_at(&c, "/out/small", O_CREAT | O_WRONLY, b"tiny", 0);
    c.chmod("/out/small", 0o600).unwrap();
    c.truncate("/in/sub/big", 70_000).unwrap();
    c.symlink("deep/result", "/out/ln").unwrap();
    c.sync().unwrap();
    assert_eq!(c.flush_status("/").unwrap().chunks, 0);
    let b = &t.0;
    assert_eq!(fs::read(b.join("in/multi")).unwrap(), multi);
    assert_eq!(fs::read(b.join("out/deep/result")).unwrap(), big);
    assert_eq!(fs::read(b.join("out/small")).unwrap(), b"tiny");
    assert_eq!(
        fs::metadata(b.join("out/small"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(b.join("out")).unwrap().permissions().mode() & 0o777,
        0o750
    );
    assert_eq!(
        fs::metadata(b.join("out/deep"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(
        fs::read(b.join("in/sub/big")).unwrap(),
        files[3].1[..70_000]
    );
    assert_eq!(
        fs::read_link(b.join("out/ln")).unwrap(),
        Path::new("deep/result")
    );
    let st = c.stat("/out/deep/result").unwrap();
    assert_eq!(
        fs::metadata(b.join("out/deep/result")).unwrap().mtime(),
        st.mtime / 1_000_000_000,
        "mtime kept"
    );
    // Untouched files are not rewritten.
    assert_eq!(fs::read(b.join("in/small")).unwrap(), files[1].1);
}

#[test]
fn namespace_changes_reach_the_backend_in_mirror_mode() {
    let t = Tmp::new("mirror");
    make_tree(&t.0);
    let (_p, c) = cache_pool(&t.0, 2, &[]);
    c.unlink("/in/small").unwrap();
    assert!(!t.0.join("in/small").exists());
    c.rename("/in/multi", "/in/moved").unwrap();
    assert!(t.0.join("in/moved").exists() && !t.0.join("in/multi").exists());
    assert_eq!(read_all(&c, "/in/moved"), pattern(50_000, 2));
    assert_eq!(c.rmdir("/in/sub").unwrap_err().errno(), libc::ENOTEMPTY);
    c.unlink("/in/sub/big").unwrap();
    c.rmdir("/in/sub").unwrap();
    assert!(!t.0.join("in/sub").exists());
}

#[test]
fn keep_policy_leaves_the_backend_alone() {
    let t = Tmp::new("keep");
    make_tree(&t.0);
    let (_p, c) = cache_pool(&t.0, 2, &["--backend-policy", "keep"]);
    c.unlink("/in/small").unwrap();
    assert_eq!(
        c.stat("/in/small").unwrap_err().errno(),
        libc::ENOENT,
        "hidden by a whiteout"
    );
    assert!(!c.readdir("/in").unwrap().iter().any(|e| e.name == "small"));
    assert!(t.0.join("in/small").exists(), "backend untouched");
    assert_eq!(
        c.rename("/in/multi", "/in/x").unwrap_err().errno(),
        libc::EXDEV
    );
    assert_eq!(read_all(&c, "/in/multi"), pattern(50_000, 2));
    write_at(&c, "/in/small", O_CREAT | O_WRONLY, b"again", 0);
    assert_eq!(read_all(&c, "/in/small"), b"again");
}

#[test]
fn stagein_fetches_everything() {
    let t = Tmp::new("stage");
    let files = make_tree(&t.0);
    let (_p, c) = cache_pool(&t.0, 3, &[]);
    let bytes = c.stagein("/in").unwrap();
    assert_eq!(bytes, files.iter().map(|f| f.1.len() as u64).sum::<u64>());
    // With the backend gone, everything is still readable from the cache.
    let moved = t.0.with_extension("gone");
    fs::rename(&t.0, &moved).unwrap();
    fs::create_dir_all(&t.0).unwrap();
    for (p, d) in &files {
        assert_eq!(&read_all(&c, p), d, "{p}");
    }
    let _ = fs::remove_dir_all(&moved);
}

#[test]
fn path_escapes_are_refused() {
    let t = Tmp::new("escape");
    let outside = Tmp::new("outside");
    fs::write(outside.0.join("secret"), b"do not read").unwrap();
    std::os::unix::fs::symlink(&outside.0, t.0.join("escape")).unwrap();
    let (_p, c) = cache_pool(&t.0, 2, &[]);
    assert!(c.lstat("/escape").unwrap().is_symlink());
    let e = c.stat("/escape/secret").unwrap_err();
    assert!(
        [libc::EXDEV, libc::ENOENT, libc::ELOOP].contains(&e.errno()),
        "{e}"
    );
    assert_eq!(
        c.stat("/../../etc/passwd").unwrap_err().errno(),
        libc::ENOENT,
        ".. stays inside"
    );
    // Writes through the escape are refused too, and nothing lands outside.
    assert!(c.open("/escape/new", O_CREAT | O_WRONLY, 0o644).is_err());
    assert!(!outside.0.join("new").exists());
}

#[test]
fn backend_errors_keep_data_dirty_until_it_is_writable() {
    let t = Tmp::new("ro");
    // Long idle time: nothing is flushed until we ask.
    let (_p, c) = cache_pool(&t.0, 2, &["--flush-idle-msec", "60000"]);
    let data = pattern(40_000, 7);
    c.mkdir("/locked", 0o755).unwrap();
    write_at(
        &c,
        "/locked/out.dat",
        O_CREAT | O_WRONLY | O_TRUNC,
        &data,
        0,
    );
    // A directory appearing in the backend in the way of the file makes
    // every flush of it fail (EISDIR), whatever our privileges.
    fs::create_dir_all(t.0.join("locked/out.dat")).unwrap();
    let e = c
        .wait_flushed("/", Some(Duration::from_secs(2)))
        .unwrap_err();
    assert!([libc::ETIMEDOUT, libc::EISDIR].contains(&e.errno()), "{e}");
    let s = c.flush_status("/locked").unwrap();
    assert!(s.chunks > 0 && s.failing > 0, "{s:?}");
    assert!(s.last_error.contains("out.dat"), "{}", s.last_error);
    let status = c.server_status();
    assert!(
        status
            .iter()
            .any(|(_, s)| s.as_ref().unwrap().flush.failing > 0),
        "visible in status"
    );
    fs::remove_dir(t.0.join("locked/out.dat")).unwrap();
    c.sync().unwrap();
    assert_eq!(fs::read(t.0.join("locked/out.dat")).unwrap(), data);
}

#[test]
fn idle_flushing_happens_without_sync() {
    let t = Tmp::new("idle");
    let (_p, c) = cache_pool(&t.0, 2, &[]);
    write_at(
        &c,
        "/auto",
        O_CREAT | O_WRONLY,
        b"written back when idle",
        0,
    );
    for _ in 0..200 {
        if fs::read(t.0.join("auto")).ok().as_deref() == Some(b"written back when idle") {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("not flushed after 5 s of idleness");
}

/// Dirty data survives `kill -9` of every server in the middle of a flush
/// when the store is persistent: after a restart on the same paths the
/// dirty set is rescanned and every byte reaches the backend.
#[test]
fn killed_mid_flush_then_restarted_loses_nothing() {
    for store in ["posix", "pmem"] {
        let t = Tmp::new(&format!("crash-{store}"));
        let stores = Tmp::new(&format!("stores-{store}"));
        let backend = t.0.join("backend");
        fs::create_dir_all(&backend).unwrap();
        let path = match store {
            "pmem" => stores.0.join("s{i}.pmem"),
            _ => stores.0.join("s{i}"),
        };
        let args = vec![
            "--backend".to_string(),
            backend.display().to_string(),
            "--flush-idle-msec".into(),
            "60000".into(),
            "--store".into(),
            store.into(),
            "--path".into(),
            path.display().to_string(),
            "--size".into(),
            "64M".into(),
        ];
        let mut p = LocalPool::start_with(PoolOptions {
            servers: 2,
            args,
            ..Default::default()
        })
        .unwrap();
        let c = client(&p, |c| c.chunk_size = 4096);
        // Enough 4 KiB chunks (~1,200) that flushing them takes far longer
        // than the moment between starting it and killing the servers.
        let files: Vec<(String, Vec<u8>)> = (0..8)
            .map(|i| {
                (
                    format!("/out{i}.dat"),
                    pattern(600_000 + i * 1000, 40 + i as u64),
                )
            })
            .collect();
        for (name, data) in &files {
            write_at(&c, name, O_CREAT | O_WRONLY, data, 0);
        }
        // Start flushing, and kill every server while it runs.
        let _ = c.wait_flushed("/", Some(Duration::from_millis(1)));
        p.restart_all().unwrap();
        let c = client(&p, |c| c.chunk_size = 4096);
        let left = c.flush_status("/").unwrap();
        assert!(
            left.chunks > 0,
            "{store}: the restarted servers found the dirty chunks again"
        );
        c.sync().unwrap();
        for (name, data) in &files {
            assert_eq!(
                fs::read(backend.join(&name[1..])).unwrap(),
                *data,
                "{store}: {name}"
            );
        }
    }
}

#[test]
fn dirty_chunks_moved_by_a_rebalance_are_written_back_by_their_new_owner() {
    let t = Tmp::new("rebalance");
    let (mut p, c) = cache_pool(&t.0, 2, &["--flush-idle-msec", "3600000"]);
    let files: Vec<(String, Vec<u8>)> = (0..30u64)
        .map(|i| (format!("/out{i}"), pattern(5000 + i as usize * 997, i)))
        .collect();
    for (path, d) in &files {
        write_at(&c, path, O_CREAT | O_WRONLY, d, 0);
    }
    let dirty = c.flush_status("/").unwrap().chunks;
    assert!(dirty > 0);
    p.add_server().unwrap();
    let c3 = client(&p, |c| c.chunk_size = 4096);
    let r = c3.rebalance().unwrap();
    assert!(r.moved > 0, "{r:?}");
    // Nothing was written back yet, and the dirty set moved with the data.
    assert_eq!(c3.flush_status("/").unwrap().chunks, dirty);
    assert!(!t.0.join("out0").exists());
    c3.sync().unwrap();
    for (path, d) in &files {
        assert_eq!(&fs::read(t.0.join(&path[1..])).unwrap(), d, "{path}");
    }
    assert_eq!(c3.flush_status("/").unwrap().chunks, 0);
    p.stop();
}
