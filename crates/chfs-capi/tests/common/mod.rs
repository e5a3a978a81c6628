//! Helpers shared by the C test suites: an installed PREFIX
//! (`scripts/install-capi.sh`), C programs from `tests/c/` compiled with
//! pkg-config's flags, and chfsd pools started from PREFIX/bin.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};

pub const CRATE: &str = env!("CARGO_MANIFEST_DIR");

/// A directory holding the freshly built `libchfs.so` and `chfsd`, as
/// `install-capi.sh --from` wants them. `cargo test` builds the library in
/// `target/<profile>/deps` (next to this test) without copying it up to
/// `target/<profile>`, so it is taken from there.
pub fn build_dir() -> tempfile::TempDir {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir");
    let lib = [deps.join("libchfs.so"), deps.join("../libchfs.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("libchfs.so not built (cargo build -p chfs-capi)");
    let chfsd = chfs_localpool::find_chfsd().expect("chfsd not built (cargo build -p chfs-server)");
    let d = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(&lib, d.path().join("libchfs.so")).unwrap();
    std::os::unix::fs::symlink(&chfsd, d.path().join("chfsd")).unwrap();
    d
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    out
}

pub fn check(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command with no inherited CHFS_* variables.
pub fn clean(prog: &Path) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CHFS_") {
            c.env_remove(k);
        }
    }
    c.env_remove("LD_LIBRARY_PATH");
    c
}

/// An installed tree in a temporary PREFIX.
pub struct Prefix {
    dir: tempfile::TempDir,
}

impl Prefix {
    pub fn install() -> Prefix {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = Path::new(CRATE).join("../../scripts/install-capi.sh");
        let from = build_dir();
        check(
            Command::new("bash")
                .arg(&script)
                .arg("--from")
                .arg(from.path())
                .arg(dir.path()),
        );
        Prefix { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn pkg_config(&self, args: &[&str]) -> String {
        let out = check(
            Command::new("pkg-config")
                .args(args)
                .arg("chfs")
                .env("PKG_CONFIG_PATH", self.path().join("lib/pkgconfig")),
        );
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    /// Compiles `tests/c/<name>.c` with pkg-config's flags only.
    pub fn cc(&self, name: &str, out_dir: &Path) -> PathBuf {
        let flags = self.pkg_config(&["--cflags", "--libs"]);
        let exe = out_dir.join(name);
        let src = Path::new(CRATE).join("tests/c").join(format!("{name}.c"));
        check(
            Command::new("cc")
                .args([
                    "-std=gnu99",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-O1",
                    "-pthread",
                    "-o",
                ])
                .arg(&exe)
                .arg(&src)
                .args(flags.split_whitespace()),
        );
        exe
    }

    pub fn chfsd(&self) -> PathBuf {
        self.path().join("bin/chfsd")
    }

    pub fn pool(&self, n: usize) -> LocalPool {
        self.pool_over(n, None)
    }

    /// A pool whose servers speak `protocol` (chfsd `-p`; None: TCP).
    pub fn pool_over(&self, n: usize, protocol: Option<&str>) -> LocalPool {
        LocalPool::start_with(PoolOptions {
            servers: n,
            chfsd: Some(self.chfsd()),
            args: protocol.map_or_else(Vec::new, |p| vec!["-p".into(), p.into()]),
            ..Default::default()
        })
        .expect("start chfsd pool from PREFIX/bin")
    }
}

/// The transports the C API is tested over: TCP, and `ofi+tcp` where this
/// build has libfabric (else skipped, or failed when CHFS_TEST_REQUIRE
/// asks for `fabric`).
pub fn protocols(test: &str) -> Vec<Option<&'static str>> {
    let mut v = vec![None];
    if chfs_fabric::BUILT_WITH_LIBFABRIC {
        v.push(Some("ofi+tcp"));
    } else {
        chfs_localpool::skip(
            "fabric",
            test,
            "built without libfabric: ofi+tcp not tested",
        );
    }
    v
}

pub fn rust_client(pool: &LocalPool) -> Client {
    Client::connect(ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        ..Default::default()
    })
    .expect("connect")
}
