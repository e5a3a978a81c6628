//! Unmodified programs (coreutils, Python, a C program using stdio) run
//! with `LD_PRELOAD=libchfs_preload.so` against real `chfsd` servers; the
//! results are checked through the native client.
//!
//! Needs: cc, coreutils, python3; `chfsd` built (`cargo build -p
//! chfs-server --bin chfsd`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};

/// `libchfs_preload.so` as `cargo test` built it (the integration test's
/// dependency on the library builds the cdylib too, in `deps/`).
fn preload_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("exe dir");
    [
        deps.join("libchfs_preload.so"),
        deps.join("../libchfs_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libchfs_preload.so not built (cargo build -p chfs-preload)")
}

struct Env {
    pool: LocalPool,
    mount: String,
    lib: PathBuf,
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let pool = LocalPool::start_with(PoolOptions::default().with_new_secret()).expect("pool");
        let mount = format!("/chfs-test-{}-{:x}", std::process::id(), rand());
        assert!(!Path::new(&mount).exists());
        Env {
            pool,
            mount,
            lib: preload_lib(),
            tmp: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn client(&self) -> Client {
        let mut cfg = ClientConfig {
            servers: vec![self.pool.addrs()[0].clone()],
            ..Default::default()
        };
        cfg.secret = std::fs::read_to_string(self.pool.client_key_file().unwrap())
            .unwrap()
            .trim_end()
            .as_bytes()
            .to_vec();
        Client::connect(cfg).expect("connect")
    }

    fn m(&self, p: &str) -> String {
        format!("{}{p}", self.mount)
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CHFS_") {
                c.env_remove(k);
            }
        }
        c.env("LD_PRELOAD", &self.lib)
            .env("CHFS_MOUNTPOINT", &self.mount)
            .env("CHFS_SERVER", self.pool.server_string())
            .env("CHFS_SECRET_FILE", self.pool.client_key_file().unwrap())
            .current_dir(self.tmp.path());
        c
    }

    fn ok(&self, prog: &str, args: &[&str]) -> Output {
        let out = self.cmd(prog).args(args).output().expect("spawn");
        assert!(
            out.status.success(),
            "{prog} {args:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn stdout(&self, prog: &str, args: &[&str]) -> String {
        String::from_utf8(self.ok(prog, args).stdout).unwrap()
    }
}

fn rand() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

fn read_all(c: &Client, p: &str) -> Vec<u8> {
    let fd = c.open(p, libc::O_RDONLY, 0).expect(p);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
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

fn write_all(c: &Client, p: &str, data: &[u8]) {
    let fd = c.create(p, libc::O_WRONLY | libc::O_TRUNC, 0o644).expect(p);
    assert_eq!(c.write(fd, data).unwrap(), data.len());
    c.close(fd).unwrap();
}

#[test]
fn coreutils_cat_cp_ls_mkdir_mv_rm_md5sum_dd() {
    let e = Env::new();
    let c = e.client();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    write_all(&c, "/a.bin", &data);

    // cat reads a chfs-rs file
    let out = e.ok("cat", &[&e.m("/a.bin")]);
    assert_eq!(out.stdout, data);

    // cp out of the prefix and into it
    let local = e.tmp.path().join("copy.bin");
    e.ok("cp", &[&e.m("/a.bin"), local.to_str().unwrap()]);
    assert_eq!(std::fs::read(&local).unwrap(), data);
    e.ok("cp", &[local.to_str().unwrap(), &e.m("/b.bin")]);
    assert_eq!(read_all(&c, "/b.bin"), data);

    // mkdir -p, ls -l
    e.ok("mkdir", &["-p", &e.m("/d1/d2/d3")]);
    assert!(c.stat("/d1/d2/d3").unwrap().is_dir());
    e.ok("cp", &[&e.m("/b.bin"), &e.m("/d1/d2/c.bin")]);
    let ls = e.stdout("ls", &["-l", &e.m("/d1/d2")]);
    assert!(
        ls.contains("c.bin") && ls.contains("300000") && ls.contains("d3"),
        "{ls}"
    );
    let ls = e.stdout("ls", &[&e.m("/")]);
    assert_eq!(
        ls.split_whitespace().collect::<Vec<_>>(),
        ["a.bin", "b.bin", "d1"]
    );

    // md5sum agrees with the local copy
    let m1 = e.stdout("md5sum", &[&e.m("/a.bin")]);
    let m2 = e.stdout("md5sum", &[local.to_str().unwrap()]);
    assert_eq!(m1.split_whitespace().next(), m2.split_whitespace().next());

    // dd with a block size and an offset
    e.ok(
        "dd",
        &[
            &format!("if={}", e.m("/a.bin")),
            &format!("of={}", e.m("/dd.bin")),
            "bs=4096",
            "skip=2",
            "count=10",
            "status=none",
        ],
    );
    assert_eq!(read_all(&c, "/dd.bin"), &data[8192..8192 + 40960]);

    // mv inside the prefix, and out of it (EXDEV: copy and unlink)
    e.ok("mv", &[&e.m("/b.bin"), &e.m("/d1/moved.bin")]);
    assert!(c.stat("/b.bin").is_err());
    assert_eq!(read_all(&c, "/d1/moved.bin"), data);
    let out_local = e.tmp.path().join("out.bin");
    e.ok("mv", &[&e.m("/d1/moved.bin"), out_local.to_str().unwrap()]);
    assert_eq!(std::fs::read(&out_local).unwrap(), data);
    assert!(c.stat("/d1/moved.bin").is_err());

    // find, then rm -r
    let found = e.stdout("find", &[&e.m("/d1")]);
    let mut f: Vec<_> = found.lines().collect();
    f.sort();
    let want = ["/d1", "/d1/d2", "/d1/d2/c.bin", "/d1/d2/d3"].map(|p| e.m(p));
    assert_eq!(f, want.iter().map(String::as_str).collect::<Vec<_>>());
    e.ok("rm", &["-r", &e.m("/d1")]);
    assert!(c.stat("/d1").is_err());
}

#[test]
fn python_open_listdir_walk_copytree() {
    let e = Env::new();
    let c = e.client();
    let script = format!(
        r#"
import os, shutil
m = {m:?}
os.makedirs(m + "/src/sub")
with open(m + "/src/a.txt", "w") as f:
    f.write("alpha\n" * 1000)
with open(m + "/src/sub/b.txt", "wb") as f:
    f.write(b"beta")
print(sorted(os.listdir(m + "/src")))
print(sorted((d, sorted(fs)) for d, _, fs in os.walk(m + "/src")))
shutil.copytree(m + "/src", m + "/dst")
with open(m + "/dst/sub/b.txt") as f:
    assert f.read() == "beta"
os.chdir(m + "/dst")
print(os.getcwd())
print(open("a.txt").read().count("alpha"))
"#,
        m = e.mount
    );
    let out = e.stdout("python3", &["-c", &script]);
    let lines: Vec<_> = out.lines().collect();
    assert_eq!(lines[0], "['a.txt', 'sub']");
    assert!(lines[1].contains("['b.txt']"), "{out}");
    assert_eq!(lines[2], e.m("/dst"));
    assert_eq!(lines[3], "1000");
    assert_eq!(read_all(&c, "/dst/a.txt"), b"alpha\n".repeat(1000));
    assert_eq!(read_all(&c, "/dst/sub/b.txt"), b"beta");
}

#[test]
fn c_stdio_local_file_and_fork() {
    let e = Env::new();
    let c = e.client();
    let exe = e.tmp.path().join("stdio");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/stdio.c");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success());
    let local = e.tmp.path().join("local.txt");
    let out = e.stdout(
        exe.to_str().unwrap(),
        &[&e.m("/s.txt"), local.to_str().unwrap()],
    );
    assert_eq!(out, "ok\n");
    assert_eq!(read_all(&c, "/s.txt"), b"hello 42\nsecond line\n");
    // the local file is on the local disk, not in the pool
    assert_eq!(std::fs::read(&local).unwrap(), b"local\n");
    assert!(c.stat(local.to_str().unwrap()).is_err());
}

#[test]
fn without_a_server_calls_fail_with_errno_and_other_paths_work() {
    let e = Env::new();
    let out = e
        .cmd("cat")
        .arg(e.m("/x"))
        .env("CHFS_SERVER", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("cat: "), "{err}");
    // a program that never touches the prefix is unaffected
    let out = e
        .cmd("ls")
        .arg("/")
        .env("CHFS_SERVER", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(out.status.success());
}

#[test]
fn tar_create_and_extract() {
    let e = Env::new();
    let c = e.client();
    c.mkdir("/t", 0o755).unwrap();
    write_all(&c, "/t/one", b"first file\n");
    write_all(&c, "/t/two", &vec![7u8; 100_000]);
    let tarball = e.tmp.path().join("t.tar");
    e.ok(
        "tar",
        &["cf", tarball.to_str().unwrap(), "-C", &e.mount, "t"],
    );
    e.ok("mkdir", &[&e.m("/x")]);
    e.ok("tar", &["xf", tarball.to_str().unwrap(), "-C", &e.m("/x")]);
    assert_eq!(read_all(&c, "/x/t/one"), b"first file\n");
    assert_eq!(read_all(&c, "/x/t/two"), vec![7u8; 100_000]);
}
