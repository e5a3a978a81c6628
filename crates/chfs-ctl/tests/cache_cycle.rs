//! Issue 6: a job's whole cache-mode cycle with the real binaries, as a
//! user runs it — `chfsctl -b BACKEND -m MNT start`, `chstagein`, the job's
//! I/O through the chfuse mount, `chfs sync`, `chfsctl stop` and `clean` —
//! and what happens when the backend becomes unwritable in the middle.
//!
//! Needs chfsd and chfuse next to chfsctl (chstagein and chfs are this
//! crate's): `cargo build -p chfs-server -p chfs-fuse -p chfs-ctl`.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use common::*;

/// Runs a tool like `common::run`, with `stdin` as its standard input, and
/// fails the test (killing the tool by its PID) if it runs longer than
/// `limit`: a hanging `stop` is a bug, not a slow test.
fn run_in(prog: &Path, args: &[&str], env: &[(&str, &str)], stdin: &[u8], limit: u64) -> Output {
    let mut c = tool(prog, args, env);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t = Instant::now();
    let mut child = c.spawn().expect("spawn tool");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(limit)) {
        Ok(r) => r.expect("wait for tool"),
        Err(_) => {
            // SAFETY: kill(2) on the PID of the child this function spawned
            // and has not reaped yet (the waiting thread still waits).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!(
                "{} {} still running after {limit} s",
                prog.display(),
                args.join(" ")
            );
        }
    };
    eprintln!(
        "$ {} {}  ({:.2} s)\n  -> {:?}\n  stdout: {}\n  stderr: {}",
        prog.display(),
        args.join(" "),
        t.elapsed().as_secs_f64(),
        out.status.code(),
        text(&out.stdout).trim_end(),
        text(&out.stderr).trim_end()
    );
    out
}

fn envs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Is `dir` a mount point of this mount namespace (/proc/self/mountinfo)?
fn mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(&*want))
}

/// One entry of a directory tree.
#[derive(Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Link(PathBuf),
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Node::Dir => write!(f, "dir"),
            Node::File(b) => write!(f, "file({} bytes, fnv {:016x})", b.len(), fnv(b)),
            Node::Link(t) => write!(f, "symlink -> {}", t.display()),
        }
    }
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

type Tree = BTreeMap<String, Node>;

/// Everything under `root`, by path relative to it.
fn snapshot(root: &Path) -> Tree {
    fn walk(root: &Path, rel: &str, t: &mut Tree) {
        let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let r = if rel.is_empty() {
                n
            } else {
                format!("{rel}/{n}")
            };
            let p = root.join(&r);
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                t.insert(r.clone(), Node::Dir);
                walk(root, &r, t);
            } else if md.is_symlink() {
                t.insert(r, Node::Link(std::fs::read_link(&p).unwrap()));
            } else {
                t.insert(r, Node::File(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut t = Tree::new();
    walk(root, "", &mut t);
    t
}

/// Asserts two trees are equal, listing the differing paths.
fn assert_same(what: &str, got: &Tree, want: &Tree) {
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("  missing {p} ({w:?})")),
            Some(g) if g != w => diffs.push(format!("  {p}: {g:?}, expected {w:?}")),
            _ => {}
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            diffs.push(format!("  unexpected {p} ({g:?})"));
        }
    }
    assert!(diffs.is_empty(), "{what} differs:\n{}", diffs.join("\n"));
}

/// Deterministic bytes of a given length and seed.
fn data(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Writes a tree (directories first) under `root`.
fn write_tree(root: &Path, t: &Tree) {
    for (p, n) in t {
        let f = root.join(p);
        match n {
            Node::Dir => std::fs::create_dir_all(&f).unwrap(),
            Node::File(b) => std::fs::write(&f, b).unwrap(),
            Node::Link(to) => std::os::unix::fs::symlink(to, &f).unwrap(),
        }
    }
}

/// Total bytes stored by the servers (column BYTES of `chfsctl status`).
fn stored_bytes(status_stdout: &str) -> u64 {
    status_stdout
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("up"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Unmounts (lazily) whatever is still mounted on the given paths when the
/// test ends, even if it failed; runs before the scratch directory goes.
struct Unmount(Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for m in &self.0 {
            if mounted(m) {
                let _ = Command::new("fusermount3").arg("-uz").arg(m).output();
            }
            if mounted(m) {
                let _ = Command::new("umount").arg("-l").arg(m).output();
            }
        }
    }
}

/// The input tree of the job: nested directories, 19 regular files of
/// 0 bytes to several chunks (64 KiB, the default chunk size of files
/// imported from the backend) and a symbolic link.
fn input_tree() -> Tree {
    let mut t = Tree::new();
    for d in ["in", "in/a", "in/a/b", "in/a/b/c", "in/many"] {
        t.insert(d.into(), Node::Dir);
    }
    t.insert(
        "in/a/small.txt".into(),
        Node::File(b"hello, cache\n".to_vec()),
    );
    t.insert("in/a/empty".into(), Node::File(Vec::new()));
    t.insert("in/a/b/c/deep.bin".into(), Node::File(data(100_000, 1)));
    t.insert("in/big.bin".into(), Node::File(data(300_001, 2)));
    t.insert("in/exact.bin".into(), Node::File(data(65_536, 3)));
    for i in 0..14u32 {
        let len = [0, 1, 17, 4095, 4096, 4097, 9000, 65_535, 65_537, 131_072][i as usize % 10];
        t.insert(
            format!("in/many/f{i:02}"),
            Node::File(data(len + i as usize, 10 + i)),
        );
    }
    t.insert("in/link".into(), Node::Link(PathBuf::from("a/small.txt")));
    t
}

#[test]
fn job_cycle_stagein_run_sync_stop_clean() {
    if let Some(why) = fuse_unusable() {
        chfs_localpool::skip("fuse", "job_cycle_stagein_run_sync_stop_clean", &why);
        return;
    }
    let t0 = Instant::now();
    let (chfsd, chfuse) = (chfsd(), sibling("chfuse"));
    let (chstagein, chfs, ctl) = (bin("chstagein"), bin("chfs"), bin("chfsctl"));
    let sc = Scratch::new();
    let s = sc.s();
    let backend = sc.dir.path().join("backend");
    let mnt = sc.dir.path().join("mnt");
    let _unmount = Unmount(vec![mnt.clone()]);
    std::fs::create_dir(&backend).unwrap();
    let b = backend.to_str().unwrap();
    let m = mnt.to_str().unwrap();

    // 1. The job's input in the backend.
    let input = input_tree();
    write_tree(&backend, &input);
    assert_same("backend before the job", &snapshot(&backend), &input);
    let input_bytes: u64 = input
        .values()
        .map(|n| match n {
            Node::File(b) => b.len() as u64,
            _ => 0,
        })
        .sum();

    // 2. Start two servers on this host in front of the backend, mounted.
    let a = [
        "-c",
        &s,
        "-b",
        b,
        "-m",
        m,
        "-n",
        "2",
        "--chfsd",
        chfsd.to_str().unwrap(),
        "--chfuse",
        chfuse.to_str().unwrap(),
    ];
    let out = run_in(&ctl, &[&a[..], &["start"]].concat(), &[], b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    assert!(var(&env, "CHFS_SERVER").is_some(), "start sets CHFS_SERVER");
    assert!(var(&env, "CHFS_SECRET_FILE").is_some());
    assert_eq!(var(&env, "CHFS_BACKEND_PATH"), Some(b));
    let e = envs(&env);
    assert!(mounted(&mnt), "chfuse mounted on {m}");
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2, "two recorded servers");
    assert!(pids.iter().all(|&p| chfsd_alive(p)));
    let out = run_in(&ctl, &[&a[..], &["status"]].concat(), &e, b"", 30);
    assert_eq!(out.status.code(), Some(0));
    let before = stored_bytes(&text(&out.stdout));
    assert!(before < 4096, "nothing cached yet: {before} bytes");

    // 3. Stage the input in: `find` in the backend, turned into paths of
    // the file system's namespace, piped into chstagein.
    let t = Instant::now();
    let script = r#"cd "$1" && find in | sed 's|^|/|' | "$2" -v"#;
    let st = chstagein.to_str().unwrap();
    let out = run_in(Path::new("sh"), &["-c", script, "sh", b, st], &e, b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("chstagein: {} paths", input.len())),
        "every path read from standard input"
    );
    eprintln!(
        "staged {} paths, {input_bytes} bytes in {:?}",
        input.len(),
        t.elapsed()
    );
    let out = run_in(&ctl, &[&a[..], &["status"]].concat(), &e, b"", 30);
    assert_eq!(out.status.code(), Some(0));
    let cached = stored_bytes(&text(&out.stdout));
    assert!(
        cached >= input_bytes,
        "the servers store the staged input: {cached} < {input_bytes} bytes"
    );
    let out = run_in(&chfs, &["flush-status", "/in"], &e, b"", 30);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("/in: 0 dirty chunks, 0 bytes"),
        "staged input is clean"
    );

    // 4. The job, through the mount.
    let through_mount = snapshot(&mnt.join("in"));
    let input_below: Tree = input
        .iter()
        .filter_map(|(p, n)| Some((p.strip_prefix("in/")?.to_string(), n.clone())))
        .collect();
    assert_same("input read through the mount", &through_mount, &input_below);
    let mut want = input.clone();
    let mut put = |p: &str, n: Node| {
        let f = mnt.join(p);
        match &n {
            Node::Dir => std::fs::create_dir(&f).unwrap(),
            Node::File(b) => std::fs::write(&f, b).unwrap(),
            Node::Link(_) => unreachable!(),
        }
        want.insert(p.to_string(), n);
    };
    put("out", Node::Dir);
    put("out/sub", Node::Dir);
    put("out/empty-dir", Node::Dir);
    put("out/result.5m", Node::File(data(5 << 20, 100)));
    put("out/r0", Node::File(data(10, 101)));
    put("out/r1", Node::File(data(70_000, 102)));
    put("out/sub/r2", Node::File(data(4096, 103)));
    put("out/zero", Node::File(Vec::new()));
    // Overwrite an input (truncating it to a shorter, different content).
    put("in/many/f13", Node::File(data(5_000, 104)));
    // Append to an input of several chunks.
    let tail = data(70_000, 105);
    {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(mnt.join("in/big.bin"))
            .unwrap();
        f.write_all(&tail).unwrap();
    }
    if let Some(Node::File(b)) = want.get_mut("in/big.bin") {
        b.extend_from_slice(&tail);
    }
    // Rename an output, remove an input.
    std::fs::rename(mnt.join("out/r1"), mnt.join("out/r1.final")).unwrap();
    let r1 = want.remove("out/r1").unwrap();
    want.insert("out/r1.final".into(), r1);
    std::fs::remove_file(mnt.join("in/many/f07")).unwrap();
    want.remove("in/many/f07");
    assert!(
        !backend.join("in/many/f07").exists(),
        "mirror: unlink at once"
    );
    assert_same("the pool through the mount", &snapshot(&mnt), &want);

    // 5. Write back, stop.
    let t = Instant::now();
    let out = run_in(&chfs, &["sync"], &e, b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    eprintln!("chfs sync: {:?}", t.elapsed());
    let out = run_in(&chfs, &["flush-status"], &e, b"", 30);
    assert!(text(&out.stdout).contains("/: 0 dirty chunks, 0 bytes"));
    assert_same("backend after chfs sync", &snapshot(&backend), &want);
    let t = Instant::now();
    let out = run_in(&ctl, &[&a[..], &["stop"]].concat(), &e, b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    eprintln!("chfsctl stop: {:?}", t.elapsed());
    assert!(!mounted(&mnt), "stop unmounted {m}");
    assert!(
        pids.iter().all(|&p| !chfsd_alive(p)),
        "no chfsd of this test left"
    );
    assert!(recorded_pids(&sc.scratch()).is_empty());
    assert_same("backend after stop", &snapshot(&backend), &want);
    let out = run_in(&ctl, &[&a[..], &["status"]].concat(), &[], b"", 30);
    assert_eq!(out.status.code(), Some(1), "status after stop fails");
    assert!(text(&out.stderr).contains("no server found"));

    // 6. Clean the scratch data; the backend stays.
    let out = run_in(&ctl, &[&a[..], &["clean"]].concat(), &[], b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists(), "clean removed {s}");
    assert_same("backend after clean", &snapshot(&backend), &want);
    eprintln!("whole cycle: {:?}", t0.elapsed());
}

fn client(env: &[(String, String)]) -> Client {
    let mut cfg = ClientConfig::from_lookup(|k| var(env, k).map(String::from)).unwrap();
    cfg.rpc_timeout = Duration::from_secs(10);
    Client::connect(cfg).unwrap()
}

fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = c.read(fd, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    c.close(fd).unwrap();
    out
}

#[test]
fn unwritable_backend_fails_sync_and_stop_and_loses_nothing() {
    const NAME: &str = "unwritable_backend_fails_sync_and_stop_and_loses_nothing";
    if let Some(why) = fuse_unusable() {
        chfs_localpool::skip("fuse", NAME, &why);
        return;
    }
    let (chfsd, chfuse) = (chfsd(), sibling("chfuse"));
    let (chfs, ctl) = (bin("chfs"), bin("chfsctl"));
    let sc = Scratch::new();
    let s = sc.s();
    let real = sc.dir.path().join("backend");
    let backend = sc.dir.path().join("backend-view");
    let mnt = sc.dir.path().join("mnt");
    std::fs::create_dir(&real).unwrap();
    std::fs::create_dir(&backend).unwrap();
    // The backend is a bind mount of `real` that is made read-only mid-job
    // (root ignores file modes, not a read-only mount).
    let sh = |cmd: &[&str]| Command::new(cmd[0]).args(&cmd[1..]).output();
    let (b, m) = (backend.to_str().unwrap(), mnt.to_str().unwrap());
    match sh(&["mount", "--bind", real.to_str().unwrap(), b]) {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = format!("mount --bind: {}", text(&o.stderr).trim());
            chfs_localpool::skip("root", NAME, &why);
            return;
        }
        Err(e) => {
            chfs_localpool::skip("root", NAME, &format!("mount: {e}"));
            return;
        }
    }
    let _unmount = Unmount(vec![mnt.clone(), backend.clone()]);
    let input = data(200_000, 7);
    std::fs::write(real.join("input.dat"), &input).unwrap();

    let a = [
        "-c",
        &s,
        "-b",
        b,
        "-m",
        m,
        "-n",
        "2",
        "--chfsd",
        chfsd.to_str().unwrap(),
        "--chfuse",
        chfuse.to_str().unwrap(),
        // No write-back on its own during the job: it is dirty at remount.
        "-O",
        "--flush-idle-msec 600000",
    ];
    let out = run_in(&ctl, &[&a[..], &["start"]].concat(), &[], b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let e = envs(&env);
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);

    // The job: reads its input, writes a result in a new directory and
    // overwrites part of the input.
    assert_eq!(std::fs::read(mnt.join("input.dat")).unwrap(), input);
    let result = data(300_000, 8);
    std::fs::create_dir(mnt.join("out")).unwrap();
    std::fs::write(mnt.join("out/result.dat"), &result).unwrap();
    let mut changed = input.clone();
    changed[100_000..100_010].copy_from_slice(b"0123456789");
    std::fs::write(mnt.join("input.dat"), &changed).unwrap();

    // The backend becomes read-only.
    let o = sh(&["mount", "-o", "remount,bind,ro", b]).unwrap();
    assert!(o.status.success(), "remount ro: {}", text(&o.stderr));
    assert!(std::fs::write(backend.join("probe"), b"x").is_err());

    let t = Instant::now();
    let out = run_in(&chfs, &["sync"], &e, b"", 30);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "chfs sync fails: {err}");
    assert!(
        err.contains("Read-only file system") && err.contains("cannot be written back"),
        "sync names the backend error: {err}"
    );
    eprintln!("failing chfs sync returned after {:?}", t.elapsed());
    let out = run_in(&chfs, &["flush-status"], &e, b"", 30);
    let st = text(&out.stdout);
    assert!(st.contains("chunks failing; last error: backend"), "{st}");
    assert!(st.contains("Read-only file system"), "{st}");
    // Nothing lost: the job's data is still there through the mount.
    assert_eq!(std::fs::read(mnt.join("out/result.dat")).unwrap(), result);
    assert_eq!(std::fs::read(mnt.join("input.dat")).unwrap(), changed);

    let out = run_in(&ctl, &[&a[..], &["stop"]].concat(), &e, b"", 30);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stop fails: {err}");
    assert!(
        err.contains("could not be written back") && err.contains("Read-only file system"),
        "stop names the backend error: {err}"
    );
    assert!(
        pids.iter().all(|&p| chfsd_alive(p)),
        "the servers keep running with the dirty data"
    );
    assert!(mounted(&mnt), "a failed stop leaves the mount");
    assert_eq!(std::fs::read(mnt.join("out/result.dat")).unwrap(), result);
    let c = client(&env);
    assert_eq!(read_all(&c, "/out/result.dat"), result);
    assert_eq!(read_all(&c, "/input.dat"), changed);
    drop(c);
    assert_eq!(std::fs::read(real.join("input.dat")).unwrap(), input);
    assert!(!real.join("out").exists());

    // Writable again: a second stop writes everything back and stops.
    let o = sh(&["mount", "-o", "remount,bind,rw", b]).unwrap();
    assert!(o.status.success(), "remount rw: {}", text(&o.stderr));
    let out = run_in(&ctl, &[&a[..], &["stop"]].concat(), &e, b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!mounted(&mnt));
    assert!(pids.iter().all(|&p| !chfsd_alive(p)));
    assert_eq!(std::fs::read(real.join("out/result.dat")).unwrap(), result);
    assert_eq!(std::fs::read(real.join("input.dat")).unwrap(), changed);
    let out = run_in(&ctl, &[&a[..], &["clean"]].concat(), &[], b"", 30);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}
