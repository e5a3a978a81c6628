//! Mounting and unmounting: signals, fusermount3/umount, background mode,
//! stale mounts after a crash, bad configuration, a hung server.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn signal(pid: u32, sig: i32) {
    // SAFETY: sending a signal to a child process we started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    let pool = pool(2);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut m = Mount::new(&pool, &[]);
        std::fs::write(m.p("f"), b"data").unwrap();
        signal(m.pid(), sig);
        let st = m.wait_exit(Duration::from_secs(10)).expect("chfuse exits");
        assert!(st.success(), "exit status {st}");
        assert!(!is_mounted(&m.mp));
    }
    // The data written before the signal is in the pool.
    let m = Mount::new(&pool, &[]);
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"data");
}

#[test]
fn fusermount_and_umount_end_the_daemon() {
    let pool = pool(1);
    let mut m = Mount::new(&pool, &[]);
    sh(&format!("fusermount3 -u {}", q(&m.mp)));
    let st = m.wait_exit(Duration::from_secs(10)).expect("chfuse exits");
    assert!(st.success(), "{st}");
    if is_root() {
        let mut m = Mount::new(&pool, &[]);
        sh(&format!("umount {}", q(&m.mp)));
        let st = m.wait_exit(Duration::from_secs(10)).expect("chfuse exits");
        assert!(st.success(), "{st}");
    }
}

#[test]
fn background_mode_with_pid_file() {
    let pool = pool(2);
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let pidf = dir.path().join("pid");
    let st = Command::new(chfuse_bin())
        .arg(&mp)
        .arg("--pid-file")
        .arg(&pidf)
        .env("CHFS_SERVER", pool.server_string())
        .stdin(Stdio::null())
        .status()
        .unwrap();
    // The foreground command returns only once the mount is live.
    assert!(st.success());
    let pid: i32 = std::fs::read_to_string(&pidf)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    struct Guard(std::path::PathBuf, i32);
    impl Drop for Guard {
        fn drop(&mut self) {
            force_unmount(&self.0);
            // SAFETY: signalling the daemon whose PID it recorded.
            unsafe { libc::kill(self.1, libc::SIGKILL) };
        }
    }
    let _g = Guard(mp.clone(), pid);
    assert!(is_mounted(&mp));
    std::fs::write(mp.join("x"), b"1").unwrap();
    sh(&format!("fusermount3 -u {}", q(&mp)));
    let t = Instant::now();
    // SAFETY: probing whether the recorded PID still exists.
    while unsafe { libc::kill(pid, 0) } == 0 && !is_zombie(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "daemon still running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pidf.exists(), "the PID file is removed at unmount");
}

/// Has process `pid` exited, waiting to be reaped (by an init that does
/// not)?
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
    })
}

#[test]
fn foreground_pid_file_goes_at_unmount_and_the_log_is_plain_text() {
    let pool = pool(1);
    let dir = tempfile::tempdir().unwrap();
    let pidf = dir.path().join("chfuse.pid");
    let mut m = Mount::new(&pool, &["--pid-file", pidf.to_str().unwrap()]);
    let recorded = std::fs::read_to_string(&pidf).unwrap();
    assert_eq!(recorded.trim(), m.pid().to_string());
    std::fs::write(m.p("f"), b"x").unwrap();
    signal(m.pid(), libc::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10)).expect("chfuse exits");
    assert!(st.success(), "{st}");
    assert!(!pidf.exists(), "the PID file is removed at unmount");
    // Its standard error went to a file: no colour codes there.
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(log.contains("mounted"), "{log}");
    assert!(!log.contains('\x1b'), "escape codes in the log: {log:?}");

    // A PID file another chfuse has taken over since is left alone.
    let mut m = Mount::new(&pool, &["--pid-file", pidf.to_str().unwrap()]);
    std::fs::write(&pidf, "999999\n").unwrap();
    signal(m.pid(), libc::SIGTERM);
    m.wait_exit(Duration::from_secs(10)).expect("chfuse exits");
    assert_eq!(std::fs::read_to_string(&pidf).unwrap(), "999999\n");
}

#[test]
fn stale_mount_after_a_crash_is_cleared() {
    let pool = pool(2);
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let keep = tempfile::tempdir().unwrap();
    let mut m = Mount::at(&pool, keep, mp.clone(), &[]);
    std::fs::write(m.p("f"), b"survives").unwrap();
    signal(m.pid(), libc::SIGKILL);
    m.wait_exit(Duration::from_secs(10)).expect("killed");
    // With io_uring queues the kernel answers ECANCELED/ECONNABORTED for a
    // moment while it tears the rings down, then ENOTCONN.
    let t = Instant::now();
    loop {
        let e = std::fs::metadata(&mp).unwrap_err();
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            break;
        }
        assert!(
            matches!(e.raw_os_error(), Some(libc::ECANCELED | libc::ECONNABORTED))
                && t.elapsed() < Duration::from_secs(10),
            "{e}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A new chfuse on the same mount point clears the stale mount.
    m.child.take();
    let m2 = Mount::at(&pool, dir, mp.clone(), &[]);
    assert_eq!(std::fs::read(m2.p("f")).unwrap(), b"survives");
    drop(m2);
    drop(m);
}

#[test]
fn bad_configuration_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(chfuse_bin())
        .arg(dir.path())
        .env_remove("CHFS_SERVER")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CHFS_SERVER"));
    let out = Command::new(chfuse_bin())
        .arg(dir.path())
        .args(["-o", "bogus"])
        .env("CHFS_SERVER", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
    // No server listening: the background start fails with a message,
    // and nothing stays mounted.
    let out = Command::new(chfuse_bin())
        .arg(dir.path())
        .env("CHFS_SERVER", "127.0.0.1:1")
        .env("CHFS_RPC_TIMEOUT_MSEC", "2000")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!is_mounted(dir.path()));
}

/// By default a pool's local socket serves only its owner (and root): a
/// process of another user on the same host is refused, even with no
/// secret set.
#[test]
fn another_users_process_is_refused_on_the_local_socket() {
    if !is_root() {
        chfs_localpool::skip(
            "root",
            "another_users_process_is_refused_on_the_local_socket",
            "needs root to run chfuse as another user (uid 65534)",
        );
        return;
    }
    let pool = pool(2);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(chfuse_bin())
        .arg(dir.path())
        .arg("-f")
        .env("CHFS_SERVER", pool.server_string())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("user 65534 may not use this server's local socket"),
        "{err}"
    );
}

#[test]
fn ordinary_user_mounts_through_fusermount3() {
    if !is_root() {
        chfs_localpool::skip(
            "root",
            "ordinary_user_mounts_through_fusermount3",
            "needs root to run chfuse as another user (uid 65534)",
        );
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dev_mode = std::fs::metadata("/dev/fuse")
        .map(|m| m.permissions().mode())
        .unwrap_or(0);
    if dev_mode & 0o006 != 0o006 {
        // fusermount3 opens /dev/fuse with the user's rights: a mode of
        // 0600 (some containers) means no ordinary user can mount FUSE.
        chfs_localpool::skip(
            "fuse",
            "ordinary_user_mounts_through_fusermount3",
            &format!("/dev/fuse is mode {dev_mode:o}, ordinary users cannot mount FUSE here"),
        );
        return;
    }
    // A pool shared with another user: its local socket must let that
    // user in (by default only the servers' user and root may use it).
    let pool = chfs_localpool::LocalPool::start_with(chfs_localpool::PoolOptions {
        servers: 2,
        args: vec!["--local-users".into(), "65534".into()],
        ..Default::default()
    })
    .unwrap();
    // The pool's root belongs to the servers' user (root here): give the
    // ordinary user a directory of its own, as a job's admin would.
    let admin = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .unwrap();
    admin.mkdir("/u", 0o755).unwrap();
    admin.chown("/u", Some(65534), Some(65534)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let c = std::ffi::CString::new(mp.to_str().unwrap()).unwrap();
    // SAFETY: chown of a directory we created, to the unprivileged user.
    let r = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
    assert_eq!(r, 0);
    let mut child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(chfuse_bin())
        .arg(&mp)
        .arg("-f")
        .env("CHFS_SERVER", pool.server_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Guard(std::path::PathBuf);
    impl Drop for Guard {
        fn drop(&mut self) {
            force_unmount(&self.0);
        }
    }
    let _g = Guard(mp.clone());
    let t = Instant::now();
    while !is_mounted(&mp) {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("chfuse as uid 65534 exited ({st}): {err}");
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no mount");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The owner (uid 65534) uses it; its files belong to it.
    let (ok, out) = sh_status(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo hi > {}/u/f && cat {}/u/f && stat -c %u {}/u/f'",
        mp.display(),
        mp.display(),
        mp.display()
    ));
    assert!(ok, "{out}");
    assert_eq!(out, "hi\n65534\n");
    // Its large writes arrive through the socket: servers running as
    // another user (root) refuse to copy from its memory (cross-memory
    // attach is only for peers of the server's own user).
    let src = dir.path().join("big");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let (ok, out) = sh_status(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'dd if={} of={}/u/big bs=1M 2>/dev/null && cmp {} {}/u/big'",
        src.display(),
        mp.display(),
        src.display(),
        mp.display()
    ));
    assert!(ok, "{out}");
    let cma: u64 = admin
        .server_status()
        .into_iter()
        .map(|(_, s)| s.unwrap().cma_writes)
        .sum();
    assert_eq!(cma, 0, "servers copied from another user's memory");
    // The user unmounts with fusermount3 -u; the daemon exits.
    let (ok, out) = sh_status(&format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups fusermount3 -u {}",
        mp.display()
    ));
    assert!(ok, "{out}");
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            break;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chfuse did not exit after fusermount3 -u");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hung_server_times_requests_out_and_the_mount_recovers() {
    // Served over io_uring where the kernel offers it: a request waiting
    // for a stopped server holds its CPU's queue thread, and must come back
    // with an error after the RPC timeout rather than hang the mount.
    let pool = pool(2);
    let m = Mount::new_env(
        &pool,
        &["--attr-timeout", "0", "--entry-timeout", "0"],
        &[("CHFS_RPC_TIMEOUT_MSEC", "700")],
    );
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    for n in &names {
        std::fs::write(m.p(n), n.as_bytes()).unwrap();
    }
    pool.signal(1, libc::SIGSTOP).unwrap();
    // (what the failure message shows: whether the server was stopped)
    let state = |pid: Option<u32>| {
        pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("State:"))
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    let stopped = state(pool.pid(1));
    let mut ok = 0;
    let mut failed = 0;
    for n in &names {
        let t = Instant::now();
        match std::fs::read(m.p(n)) {
            Ok(d) => {
                assert_eq!(d, n.as_bytes());
                ok += 1;
            }
            Err(_) => failed += 1,
        }
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "{n}: {:?} with a 700 ms RPC timeout",
            t.elapsed()
        );
    }
    let t = Instant::now();
    let listing = std::fs::read_dir(&m.mp).and_then(|d| d.collect::<Result<Vec<_>, _>>());
    let list_time = t.elapsed();
    pool.signal(1, libc::SIGCONT).unwrap();
    assert!(
        ok > 0 && failed > 0,
        "ok {ok}, failed {failed}; server 1 {stopped:?} (pid {:?}) after SIGSTOP, servers {:?}, chfuse log:\n{}",
        pool.pid(1),
        pool.addrs(),
        std::fs::read_to_string(&m.log).unwrap_or_default()
    );
    assert!(
        listing.is_err(),
        "a listing needs every server: {listing:?}"
    );
    assert!(
        list_time < Duration::from_secs(8),
        "listing took {list_time:?}"
    );
    // The server is back: everything reads again through the same mount.
    let t = Instant::now();
    for n in &names {
        loop {
            match std::fs::read(m.p(n)) {
                Ok(d) => {
                    assert_eq!(d, n.as_bytes());
                    break;
                }
                Err(e) => {
                    assert!(t.elapsed() < Duration::from_secs(15), "{n}: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}
