//! The cache tools against a real pool with a backend directory.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use chfs_localpool::{LocalPool, PoolOptions};

#[test]
fn stagein_from_stdin_then_flush_status_and_wait() {
    let backend = std::env::temp_dir().join(format!("chfs-tools-{}", std::process::id()));
    let _ = fs::remove_dir_all(&backend);
    fs::create_dir_all(backend.join("data")).unwrap();
    for i in 0..20 {
        fs::write(
            backend.join(format!("data/f{i}")),
            vec![i as u8; 10_000 + i * 100],
        )
        .unwrap();
    }
    let args = vec![
        "--backend".into(),
        backend.display().to_string(),
        "--flush-idle-msec".into(),
        "60000".into(),
    ];
    let pool = LocalPool::start_with(PoolOptions {
        servers: 2,
        args,
        ..Default::default()
    })
    .unwrap();
    let env = [("CHFS_SERVER", pool.server_string())];
    let mut child = Command::new(env!("CARGO_BIN_EXE_chstagein"))
        .arg("-v")
        .envs(env.clone())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let list: String = (0..20).map(|i| format!("/data/f{i}\n")).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("20 paths"), "{err}");
    let chfs = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_chfs"))
            .args(args)
            .envs(env.clone())
            .output()
            .unwrap()
    };
    // A write through the library, then status, then wait.
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap();
    let fd = c.open("/data/f3", libc::O_WRONLY, 0).unwrap();
    c.pwrite(fd, b"changed", 0).unwrap();
    c.close(fd).unwrap();
    let out = chfs(&["flush-status", "/data"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !s.contains(": 0 dirty chunks"),
        "{s}"
    );
    let out = chfs(&["flush-wait", "/data", "--timeout", "30"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&fs::read(backend.join("data/f3")).unwrap()[..7], b"changed");
    let out = chfs(&["flush-status"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(": 0 dirty chunks"));
    let out = Command::new(env!("CARGO_BIN_EXE_chstagein"))
        .arg("/nope")
        .envs(env)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nope"));
    drop(pool);
    let _ = fs::remove_dir_all(&backend);
}
