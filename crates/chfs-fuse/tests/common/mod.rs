//! Shared by the mount tests: a real pool of chfsd processes and a real
//! `chfuse` mount that is always unmounted (even when a test fails).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use chfs_localpool::LocalPool;

/// The `chfuse` binary built with these tests.
pub fn chfuse_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chfuse"))
}

/// Is `mp` a live chfs FUSE mount (listed in this namespace's mountinfo)?
pub fn is_mounted(mp: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mp.to_string_lossy().to_string();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let tail = l.split_once(" - ").map(|(_, t)| t).unwrap_or("");
        let t: Vec<&str> = tail.split(' ').collect();
        f.len() > 4 && f[4] == want && t.len() > 1 && t[0].starts_with("fuse") && t[1] == "chfs"
    })
}

/// Unmounts `mp`: fusermount3 -u, then a lazy detach as a last resort.
/// Is a FUSE file system mounted on `mp` and answering?
pub fn fuse_answers(mp: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct it is given; the path is a
    // NUL-terminated string that lives across the call.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == FUSE_SUPER_MAGIC
    }
}

pub fn force_unmount(mp: &Path) {
    for args in [&["-u", "-q"][..], &["-u", "-q", "-z"][..]] {
        if !is_mounted(mp) {
            return;
        }
        let _ = Command::new("fusermount3")
            .args(args)
            .arg(mp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if is_mounted(mp) {
        let _ = Command::new("umount").arg("-l").arg(mp).status();
    }
}

/// A `chfuse -f` process serving a mount point in a temporary directory.
/// Drop unmounts (fusermount3 -u) and stops the process by its PID.
pub struct Mount {
    /// The mount point.
    pub mp: PathBuf,
    /// The chfuse process.
    pub child: Option<Child>,
    _dir: tempfile::TempDir,
    /// chfuse's log.
    pub log: PathBuf,
}

impl Mount {
    /// Mounts `pool` with extra chfuse arguments.
    pub fn new(pool: &LocalPool, args: &[&str]) -> Mount {
        Self::new_env(pool, args, &[])
    }

    /// Like [`Mount::new`] with extra environment variables for chfuse.
    pub fn new_env(pool: &LocalPool, args: &[&str], env: &[(&str, &str)]) -> Mount {
        let dir = tempfile::tempdir().expect("tempdir");
        let mp = dir.path().join("mnt");
        std::fs::create_dir(&mp).unwrap();
        Self::at_env(pool, dir, mp, args, env)
    }

    /// Mounts `pool` on `mp` (inside `dir`, which the mount keeps alive).
    pub fn at(pool: &LocalPool, dir: tempfile::TempDir, mp: PathBuf, args: &[&str]) -> Mount {
        Self::at_env(pool, dir, mp, args, &[])
    }

    /// Like [`Mount::at`] with extra environment variables for chfuse.
    pub fn at_env(
        pool: &LocalPool,
        dir: tempfile::TempDir,
        mp: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Mount {
        let log = dir.path().join("chfuse.log");
        let child = Command::new(chfuse_bin())
            .arg(&mp)
            .arg("-f")
            .args(args)
            .env("CHFS_SERVER", pool.server_string())
            .env("CHFS_RPC_TIMEOUT_MSEC", "10000")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start chfuse");
        let mut m = Mount {
            mp,
            child: Some(child),
            _dir: dir,
            log,
        };
        m.wait_mounted();
        m
    }

    fn wait_mounted(&mut self) {
        let t = Instant::now();
        // Mounted and answering, asked in one call: a stale mount left by a
        // killed daemon is listed too but answers ENOTCONN, and once chfuse
        // has cleared it the mount point is a plain directory for a moment
        // (two separate checks could see the stale mount listed and then
        // the plain directory answering).
        while !fuse_answers(&self.mp) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "chfuse exited ({st}) before mounting: {}",
                        std::fs::read_to_string(&self.log).unwrap_or_default()
                    );
                }
            }
            assert!(t.elapsed() < Duration::from_secs(20), "mount timed out");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }

    /// PID of chfuse.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Waits up to `timeout` for chfuse to exit; returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        let c = self.child.as_mut()?;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if t.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        force_unmount(&self.mp);
        if self.wait_exit(Duration::from_secs(5)).is_none() {
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            force_unmount(&self.mp);
        }
    }
}

/// A pool of `n` servers.
pub fn pool(n: usize) -> LocalPool {
    LocalPool::start(n).expect("start chfsd pool (build it first: cargo build -p chfs-server)")
}

/// A pool of `n` servers on the DRAM engine (with `args`), whatever
/// `CHFS_TEST_STORE` says: for tests of what only it does (a server
/// restarted empty, a store of `--size`, free memory as free space).
pub fn dram_pool(n: usize, args: &[&str]) -> LocalPool {
    LocalPool::start_with(chfs_localpool::PoolOptions {
        servers: n,
        args: args.iter().map(|a| a.to_string()).collect(),
        store: Some("mem".into()),
        ..Default::default()
    })
    .expect("start chfsd pool (build it first: cargo build -p chfs-server)")
}

/// Runs a shell command, panicking with its output on failure.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a shell command, returning (success, stdout+stderr).
pub fn sh_status(cmd: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), s)
}

/// Shell-quotes a path.
pub fn q(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Are we root?
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}
