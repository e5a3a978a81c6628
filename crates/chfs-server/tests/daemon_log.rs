//! chfsd's log as a launcher or a user sees it: plain text (no ANSI colour
//! codes) into a pipe and into a log file, colours only on a terminal.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHFSD: &str = env!("CARGO_BIN_EXE_chfsd");

/// Runs chfsd on loopback until it serves, stops it with SIGTERM and
/// returns what it wrote to standard error (a pipe) and to `extra` args'
/// log file, if any.
fn run_and_stop(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let info = dir.path().join("addr");
    let mut child = Command::new(CHFSD)
        .args(["--host", "127.0.0.1:0", "--log-level", "info", "-S"])
        .arg(&info)
        .args(extra)
        .env_remove("CHFS_LOG_LEVEL")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !info.exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "chfsd did not serve");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success());
    err
}

#[test]
fn log_into_a_pipe_is_plain_text() {
    let err = run_and_stop(&[]);
    assert!(err.contains("chfsd serving"), "{err}");
    assert!(err.contains("SIGTERM"), "{err}");
    assert!(!err.contains('\x1b'), "escape codes in a pipe: {err:?}");
}

#[test]
fn log_file_is_plain_text() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chfsd.log");
    let err = run_and_stop(&["-l", log.to_str().unwrap()]);
    assert!(err.is_empty(), "{err}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("chfsd serving"), "{text}");
    assert!(!text.contains('\x1b'), "escape codes in the file: {text:?}");
}

#[test]
fn log_on_a_terminal_has_colours() {
    // script(1) runs chfsd on a pseudo-terminal and copies what it shows.
    let cmd = format!("timeout -s TERM 1 {CHFSD} --host 127.0.0.1:0 --log-level info");
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env_remove("NO_COLOR")
        .env_remove("CHFS_LOG_LEVEL")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux)");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("chfsd serving"), "{shown}");
    assert!(
        shown.contains("\x1b["),
        "no colours on a terminal: {shown:?}"
    );
}
