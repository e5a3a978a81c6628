//! Helpers of the chfs-ctl integration tests: running the tools, parsing
//! what `eval` would set, and cleaning up servers by recorded PID.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of one of this crate's binaries.
pub fn bin(name: &str) -> PathBuf {
    match name {
        "chfsctl" => env!("CARGO_BIN_EXE_chfsctl").into(),
        "chlist" => env!("CARGO_BIN_EXE_chlist").into(),
        "chmkdir" => env!("CARGO_BIN_EXE_chmkdir").into(),
        "chrmdir" => env!("CARGO_BIN_EXE_chrmdir").into(),
        "chfind" => env!("CARGO_BIN_EXE_chfind").into(),
        "chstagein" => env!("CARGO_BIN_EXE_chstagein").into(),
        "chfs" => env!("CARGO_BIN_EXE_chfs").into(),
        other => panic!("no binary {other}"),
    }
}

/// The chfsd binary (build it with `cargo build -p chfs-server`).
pub fn chfsd() -> PathBuf {
    chfs_localpool::find_chfsd().expect("chfsd binary (cargo build -p chfs-server)")
}

/// This host's name (what chfsctl puts in its file names).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(rc, 0);
    let end = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A command for one of the tools with extra environment, without the
/// caller's CHFS_* variables.
pub fn tool(prog: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(prog);
    c.args(args);
    for k in [
        "CHFS_SERVER",
        "CHFS_SECRET",
        "CHFS_SECRET_FILE",
        "CHFS_RSH",
        "CHFSD",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs a tool (see [`tool`]) and logs what it printed.
pub fn run(prog: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = tool(prog, args, env).output().expect("run tool");
    eprintln!(
        "$ {} {}\n  -> {:?}\n  stdout: {}\n  stderr: {}",
        prog.display(),
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim_end(),
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    out
}

/// Text of a stream.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What `eval "$(chfsctl ... start)"` sets, evaluated by a real `sh`.
pub fn eval_env(start_output: &str) -> Vec<(String, String)> {
    let vars = [
        "CHFS_SERVER",
        "CHFS_SECRET_FILE",
        "CHFS_BACKEND_PATH",
        "CHFS_SUBDIR_PATH",
    ];
    let script = format!(
        "eval \"$1\"; {}",
        vars.iter()
            .map(|v| format!("sh -c 'printf \"%s=%s\\n\" {v} \"${v}\"'"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let out = Command::new("sh")
        .args(["-c", &script, "sh", start_output])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("sh");
    assert!(out.status.success(), "eval failed: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Looks a variable up in an evaluated environment.
pub fn var<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

/// Is `pid` a live (not zombie) chfsd?
pub fn chfsd_alive(pid: u32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    comm.trim() == "chfsd"
        && !status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'))
}

/// Waits up to 10 s for `pid` to be no live chfsd. For a server that
/// `chfsctl stop` did not find recorded in its scratch directory (another
/// `-c`, or one known through CHFS_SERVER): stop waits until that server's
/// port is closed, which comes a moment before its process ends.
pub fn chfsd_ends(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while chfsd_alive(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// PIDs recorded in `dir/chfsd@*.pid`.
pub fn recorded_pids(dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("chfsd@") && n.ends_with(".pid")
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// A scratch directory whose recorded servers are killed (by PID, only if
/// they are chfsd) and whose files are removed when dropped, even when the
/// test failed.
pub struct Scratch {
    /// The temporary directory (removed on drop).
    pub dir: tempfile::TempDir,
}

impl Scratch {
    /// A new scratch directory.
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("chfsctl-test-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    /// Path of the scratch directory given to chfsctl (`-c`).
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    /// The scratch path as a string.
    pub fn s(&self) -> String {
        self.scratch().to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for pid in recorded_pids(&self.scratch()) {
            if chfsd_alive(pid) {
                eprintln!("cleanup: killing leftover chfsd pid {pid}");
                // SAFETY: kill(2) on a PID recorded by a server this test
                // started, checked to be a chfsd just before.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        }
    }
}

/// The reports a stage-in tool wrote with `-v` to `err`, one a process
/// (`TOOL: P paths, B bytes in ...`, or `TOOL[r/n]: ...` of rank r of n):
/// (`TOOL` or `TOOL[r/n]`, P, B), sorted.
pub fn stage_reports(err: &str, tool: &str) -> Vec<(String, usize, u64)> {
    let mut v: Vec<_> = err
        .lines()
        .filter(|l| l.starts_with(tool))
        .filter_map(|l| {
            let (who, rest) = l.split_once(": ")?;
            let w: Vec<&str> = rest.split_whitespace().collect();
            Some((
                who.to_string(),
                w.first()?.parse().ok()?,
                w.get(2)?.parse().ok()?,
            ))
        })
        .collect();
    v.sort();
    v
}

/// The reports of the `ranks` ranks of a stage-in tool in `err`
/// ([`stage_reports`]), one of each rank: paths and bytes, summed.
pub fn rank_totals(err: &str, tool: &str, ranks: usize) -> (usize, u64) {
    let r = stage_reports(err, tool);
    let who: Vec<&str> = r.iter().map(|(w, ..)| w.as_str()).collect();
    let want: Vec<String> = (0..ranks).map(|i| format!("{tool}[{i}/{ranks}]")).collect();
    assert_eq!(who, want, "{err}");
    r.iter()
        .fold((0, 0), |(p, b), (_, rp, rb)| (p + rp, b + rb))
}

/// A binary of another package of the workspace (chfsd, chfuse), next to
/// this crate's.
pub fn sibling(name: &str) -> PathBuf {
    let p = bin("chfsctl").with_file_name(name);
    assert!(
        p.is_file(),
        "{} missing: cargo build -p chfs-server -p chfs-fuse",
        p.display()
    );
    p
}

/// Why FUSE cannot be used here, if it cannot.
pub fn fuse_unusable() -> Option<String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Err(e) => Some(format!("/dev/fuse: {e}")),
        Ok(_) if Command::new("fusermount3").arg("-V").output().is_err() => {
            Some("no fusermount3 (apt package fuse3)".into())
        }
        Ok(_) => None,
    }
}

/// A pool of `servers` chfsd with `args` (no secret), speaking `protocol`
/// (`chfsd -p`; None: TCP).
pub fn pool_over(
    servers: usize,
    mut args: Vec<String>,
    protocol: Option<&str>,
) -> chfs_localpool::LocalPool {
    if let Some(p) = protocol {
        args.extend(["-p".into(), p.into()]);
    }
    let pool = chfs_localpool::LocalPool::start_with(chfs_localpool::PoolOptions {
        servers,
        args,
        ..Default::default()
    })
    .expect("start chfsd pool");
    if let Some(p) = protocol {
        assert!(pool.server_string().starts_with(&format!("{p}://")));
    }
    pool
}

/// Is the fabric transport built (`ofi+tcp` testable)? If not, the test
/// named `test` is skipped (failed when CHFS_TEST_REQUIRE has `fabric`).
pub fn fabric_built(test: &str) -> bool {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric");
        return false;
    }
    true
}

/// Defines the test `$over_fabric` running `$body(Some("ofi+tcp"))`.
#[macro_export]
macro_rules! over_ofi_tcp {
    ($over_fabric:ident, $body:ident) => {
        #[test]
        fn $over_fabric() {
            if common::fabric_built(stringify!($over_fabric)) {
                $body(Some("ofi+tcp"));
            }
        }
    };
}
