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
        Env::over(None)
    }

    /// A pool whose servers speak `protocol` (`chfsd -p`; None: TCP).
    fn over(protocol: Option<&str>) -> Env {
        let mut opts = PoolOptions::default().with_new_secret();
        if let Some(p) = protocol {
            opts.args = vec!["-p".into(), p.into()];
        }
        let pool = LocalPool::start_with(opts).expect("pool");
        if let Some(p) = protocol {
            assert!(pool.server_string().starts_with(&format!("{p}://")));
        }
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

    /// `prog args` with 4 KiB chunks and client write buffering
    /// (`CHFS_BUF_SIZE=65536`): writes beyond the first chunk and buffered
    /// ones show whether they were published; checked to succeed.
    fn buffered(&self, prog: &str, args: &[&str]) -> Output {
        let out = self
            .cmd(prog)
            .args(args)
            .env("CHFS_CHUNK_SIZE", "4096")
            .env("CHFS_BUF_SIZE", "65536")
            .output()
            .unwrap();
        checked(out, &format!("{prog} {args:?}"))
    }

    /// Compiles tests/c/NAME.c with `compiler` into the temporary directory.
    fn compile(&self, compiler: &str, name: &str) -> PathBuf {
        let exe = self.tmp.path().join(name);
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
        let st = Command::new(compiler)
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .expect(compiler);
        assert!(st.success(), "{compiler} {}", src.display());
        exe
    }
}

fn checked(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Is `prog --version` runnable?
fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
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
    coreutils(&Env::new());
}

fn coreutils(e: &Env) {
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
    python_open_listdir(&Env::new());
}

fn python_open_listdir(e: &Env) {
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
    c_stdio_fork(&Env::new());
}

fn c_stdio_fork(e: &Env) {
    let c = e.client();
    let exe = e.compile("cc", "stdio");
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
    tar(&Env::new());
}

fn tar(e: &Env) {
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

/// fsx-style: thousands of random pwrite/write/pread/read/lseek/ftruncate/
/// close-reopen/fstat/fsync operations (with a second descriptor reading
/// too) on a file with 4 KiB chunks, each compared with an in-memory model
/// by tests/c/fsx.c; the final content is compared through the native
/// client. Seeded: CHFS_FSX_SEED=N repeats a run (the seed is printed on
/// failure). With and without client write buffering (CHFS_BUF_SIZE).
#[test]
fn fsx_random_operations_match_a_model() {
    fsx(&Env::new());
}

fn fsx(e: &Env) {
    let c = e.client();
    let exe = e.compile("cc", "fsx");
    let base: u64 = std::env::var("CHFS_FSX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand() % 1_000_000_000);
    let ops: &str = &std::env::var("CHFS_FSX_OPS").unwrap_or_else(|_| "5000".into());
    for (i, bufsize) in ["0", "65536"].into_iter().enumerate() {
        for k in 0..2u64 {
            let seed = base + 2 * i as u64 + k;
            let path = format!("/fsx-{bufsize}-{k}");
            let model = e.tmp.path().join(format!("model-{bufsize}-{k}"));
            let out = e
                .cmd(exe.to_str().unwrap())
                .args([&e.m(&path), &seed.to_string(), ops])
                .arg(&model)
                .env("CHFS_CHUNK_SIZE", "4096")
                .env("CHFS_BUF_SIZE", bufsize)
                .output()
                .unwrap();
            let what = format!(
                "fsx seed {seed} CHFS_BUF_SIZE={bufsize} (CHFS_FSX_SEED={seed} repeats it)"
            );
            checked(out, &what);
            let want = std::fs::read(&model).unwrap();
            let got = read_all(&c, &path);
            assert!(
                got == want,
                "{what}: native client read {} bytes differing from the model's {}",
                got.len(),
                want.len()
            );
        }
    }
}

/// `libchfs.so` as `cargo test` built it (a dev-dependency), linked by the
/// name its soname gives (`libchfs.so.0`) from a directory of `tmp`.
fn capi_lib_dir(tmp: &Path) -> PathBuf {
    let deps = preload_lib().parent().unwrap().to_path_buf();
    let lib = [deps.join("libchfs.so"), deps.join("../libchfs.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("libchfs.so not built (cargo build -p chfs-capi)");
    let dir = tmp.join("capi-lib");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libchfs.so", "libchfs.so.0"] {
        std::os::unix::fs::symlink(&lib, dir.join(name)).unwrap();
    }
    dir
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Files written under the preload (pieces written backwards with
/// pwrite, sizes around chunk boundaries) read back through the native
/// client, through the C API (libchfs.so) and through a chfuse mount of
/// the same pool.
#[test]
fn written_under_preload_read_through_native_client_capi_and_mount() {
    let e = Env::new();
    let c = e.client();
    let sizes = [0usize, 1, 4095, 4096, 4097, 12288, 300_001];
    let data = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 13 % 251) as u8 ^ (n as u8)).collect() };
    for n in sizes {
        std::fs::write(e.tmp.path().join(format!("src{n}")), data(n)).unwrap();
    }
    let script = format!(
        r#"
import os
m, sizes = {m:?}, {sizes:?}
os.mkdir(m + "/w")
for n in sizes:
    src = open("src%d" % n, "rb").read()
    fd = os.open(m + "/w/f%d" % n, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o640)
    for off in reversed(range(0, n, 3000)):
        assert os.pwrite(fd, src[off:off + 3000], off) == len(src[off:off + 3000])
    os.close(fd)
print("ok")
"#,
        m = e.mount
    );
    let out = e
        .cmd("python3")
        .args(["-c", &script])
        .env("CHFS_CHUNK_SIZE", "4096")
        .output()
        .unwrap();
    assert_eq!(checked(out, "python3 writer").stdout, b"ok\n");
    for n in sizes {
        let p = format!("/w/f{n}");
        let st = c.stat(&p).unwrap();
        assert_eq!((st.size, st.mode & 0o777), (n as u64, 0o640), "{p}");
        assert!(read_all(&c, &p) == data(n), "{p} through the native client");
    }

    // The C API: a C program linked with libchfs.so (no preload).
    let libdir = capi_lib_dir(e.tmp.path());
    let exe = e.tmp.path().join("capi_read");
    let inc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../chfs-capi/include");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/capi_read.c"))
        .arg(format!("-I{}", inc.display()))
        .arg(format!("-L{}", libdir.display()))
        .arg(format!("-Wl,-rpath,{}", libdir.display()))
        .arg("-lchfs")
        .status()
        .expect("cc");
    assert!(st.success(), "cc capi_read.c");
    let paths: Vec<String> = sizes.iter().map(|n| format!("/w/f{n}")).collect();
    let out = e
        .cmd(exe.to_str().unwrap())
        .env_remove("LD_PRELOAD")
        .args(&paths)
        .output()
        .unwrap();
    let out = String::from_utf8(checked(out, "capi_read").stdout).unwrap();
    let want: String = sizes
        .iter()
        .map(|&n| format!("/w/f{n} {n} {}\n", fnv1a(&data(n))))
        .collect();
    assert_eq!(out, want, "through the C API");

    let chfuse = preload_lib().parent().unwrap().join("chfuse");
    let chfuse = [chfuse.clone(), chfuse.parent().unwrap().join("../chfuse")]
        .into_iter()
        .find(|p| p.is_file());
    let Some(chfuse) = chfuse.filter(|_| Path::new("/dev/fuse").exists() && have("fusermount3"))
    else {
        chfs_localpool::skip(
            "fuse",
            "written_under_preload_read_through_native_client_capi_and_mount (mount part)",
            "no /dev/fuse, fusermount3 or chfuse (cargo build -p chfs-fuse)",
        );
        return;
    };
    let m = Mount::new(&e, &chfuse);
    for n in sizes {
        let p = m.mp.join(format!("w/f{n}"));
        assert!(
            std::fs::read(&p).unwrap() == data(n),
            "{} through the mount",
            p.display()
        );
    }
}

/// A chfuse mount of the test's pool, unmounted and stopped on drop.
struct Mount {
    mp: PathBuf,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Mount {
    fn new(e: &Env, chfuse: &Path) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let mp = dir.path().join("mnt");
        std::fs::create_dir(&mp).unwrap();
        let child = Command::new(chfuse)
            .arg(&mp)
            .arg("-f")
            .env("CHFS_SERVER", e.pool.server_string())
            .env("CHFS_SECRET_FILE", e.pool.client_key_file().unwrap())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chfuse");
        let mut m = Mount {
            mp,
            child,
            _dir: dir,
        };
        let t = std::time::Instant::now();
        while !fuse_answers(&m.mp) {
            assert!(m.child.try_wait().unwrap().is_none(), "chfuse exited");
            assert!(t.elapsed().as_secs() < 20, "mount timed out");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.mp).status();
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mp)
            .status();
    }
}

fn fuse_answers(mp: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statfs fills the zeroed struct it is given; the path is a
    // NUL-terminated string that lives across the call.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == FUSE_SUPER_MAGIC
    }
}

/// An MPI program (tests/c/mpi.c) under the preload: one file per rank and
/// one shared file written at disjoint, unaligned offsets; each rank reads
/// another's after a barrier; everything checked through the native client.
#[test]
fn mpi_file_per_rank_and_shared_file() {
    if mpi_here("mpi_file_per_rank_and_shared_file") {
        mpi_ranks(&Env::new());
    }
}

/// The same over ofi+tcp: every rank's client (and Open MPI, which may
/// load libfabric itself) in one process.
#[test]
fn mpi_file_per_rank_and_shared_file_over_ofi_tcp() {
    let test = "mpi_file_per_rank_and_shared_file_over_ofi_tcp";
    if mpi_here(test) && fabric(test) {
        mpi_ranks(&Env::over(Some("ofi+tcp")));
    }
}

/// Are mpicc and mpirun here (else the test is skipped, or fails when
/// CHFS_TEST_REQUIRE has mpi)?
fn mpi_here(test: &str) -> bool {
    if !have("mpicc") || !have("mpirun") {
        chfs_localpool::skip(
            "mpi",
            test,
            "no mpicc/mpirun (apt-get install openmpi-bin libopenmpi-dev)",
        );
        return false;
    }
    true
}

fn mpi_ranks(e: &Env) {
    let c = e.client();
    let exe = e.compile("mpicc", "mpi");
    let ranks = 4usize;
    let lib = e.lib.to_str().unwrap().to_string();
    let out = e
        .cmd("mpirun")
        .env_remove("LD_PRELOAD")
        .env("CHFS_CHUNK_SIZE", "4096")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            &ranks.to_string(),
        ])
        .args(["-x", &format!("LD_PRELOAD={lib}")])
        .args([
            "-x",
            "CHFS_MOUNTPOINT",
            "-x",
            "CHFS_SERVER",
            "-x",
            "CHFS_SECRET_FILE",
        ])
        .args(["-x", "CHFS_CHUNK_SIZE"])
        .arg(&exe)
        .arg(e.m("/mpi"))
        .output()
        .unwrap();
    let out = checked(out, "mpirun");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("ok {ranks}")
    );
    let pat = |rank: usize, i: usize| ((rank * 31 + i * 7) % 251) as u8;
    const BLOCK: usize = 50001;
    let shared = read_all(&c, "/mpi/shared");
    assert_eq!(shared.len(), ranks * BLOCK);
    for r in 0..ranks {
        let own = read_all(&c, &format!("/mpi/rank.{r}"));
        assert_eq!(own.len(), 100_000 + r * 1000);
        assert!(
            own.iter().enumerate().all(|(i, b)| *b == pat(r + 100, i)),
            "rank.{r}"
        );
        let blk = &shared[r * BLOCK..(r + 1) * BLOCK];
        assert!(
            blk.iter().enumerate().all(|(i, b)| *b == pat(r, i)),
            "shared block {r}"
        );
    }
}

/// exec: a chfs-rs descriptor does not survive (the number is the reserved
/// /dev/null descriptor in the new image), but what was written through
/// it is published before the exec, and the new image (LD_PRELOAD is
/// inherited) reaches the prefix through its own preload.
#[test]
fn exec_publishes_writes_and_the_new_image_has_its_own_preload() {
    exec_publish(&Env::new());
}

fn exec_publish(e: &Env) {
    let c = e.client();
    let exe = e.compile("cc", "exec");
    let out = e
        .cmd(exe.to_str().unwrap())
        .arg(e.m("/e.bin"))
        .env("CHFS_CHUNK_SIZE", "4096")
        .output()
        .unwrap();
    assert_eq!(checked(out, "exec").stdout, b"ok\n");
    let want: Vec<u8> = (0..10_000).map(|i| b'a' + (i % 23) as u8).collect();
    assert!(read_all(&c, "/e.bin") == want);
    assert_eq!(
        read_all(&c, "/e.bin.child"),
        b"child of a preloaded parent\n"
    );
}

/// Python's subprocess (vfork, then close_range in the child) while a
/// chfs-rs file is open with buffered writes: the parent's descriptor
/// table is not the child's to change (it was: the file's descriptor was
/// released and later writes went to /dev/null). The child sees what the
/// parent published (here by fsync), as a process on another node would.
#[test]
fn python_subprocess_with_a_file_open() {
    python_subprocess(&Env::new());
}

fn python_subprocess(e: &Env) {
    let c = e.client();
    let script = format!(
        r#"
import os, subprocess
m = {m:?}
fd = os.open(m + "/sub", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, b"a" * 10000)
os.fsync(fd)
out = subprocess.run(["cat", m + "/sub"], check=True, capture_output=True).stdout
assert out == b"a" * 10000, len(out)
os.write(fd, b"b" * 10000)
assert os.fstat(fd).st_size == 20000
os.close(fd)
print("ok")
"#,
        m = e.mount
    );
    assert_eq!(e.buffered("python3", &["-c", &script]).stdout, b"ok\n");
    let got = read_all(&c, "/sub");
    assert!(
        got.len() == 20000
            && got[..10000].iter().all(|&b| b == b'a')
            && got[10000..].iter().all(|&b| b == b'b'),
        "{} bytes",
        got.len()
    );
}

/// A program that writes and exits without closing (stdio stream and
/// descriptor, with client write buffering) loses nothing: the preload
/// flushes stdio and publishes open files at exit(3).
#[test]
fn exit_without_close_publishes_everything() {
    exit_publishes(&Env::new());
}

fn exit_publishes(e: &Env) {
    let c = e.client();
    let script = format!(
        r#"
import os, sys
m = {m:?}
fd = os.open(m + "/raw", os.O_CREAT | os.O_WRONLY, 0o644)
os.write(fd, b"x" * 10000)
f = open(m + "/text", "w")
f.write("y" * 5000)
f.flush()
sys.exit(0)
"#,
        m = e.mount
    );
    e.buffered("python3", &["-c", &script]);
    assert_eq!(read_all(&c, "/raw"), vec![b'x'; 10000]);
    assert_eq!(read_all(&c, "/text"), vec![b'y'; 5000]);
}

/// A program that closes every descriptor from 3 up (a close loop,
/// close_range, closefrom) and goes on using chfs-rs files
/// (tests/c/closeall.c): its own descriptors are closed, chfs-rs ones
/// too; the client's sockets stay open (a local file given one of their
/// numbers would be written by the client: the program then fills every
/// free number with a local file and checks that it stays empty), and
/// `dup2` onto one fails with EBUSY.
#[test]
fn closing_every_descriptor_leaves_the_clients_own() {
    closeall(&Env::new());
}

fn closeall(e: &Env) {
    let c = e.client();
    let exe = e.compile("cc", "closeall");
    for mode in ["loop", "range", "from"] {
        let out = e
            .cmd(exe.to_str().unwrap())
            .args([&e.m(&format!("/{mode}")), mode])
            .output()
            .unwrap();
        let out = checked(out, &format!("closeall {mode}"));
        let s = String::from_utf8_lossy(&out.stdout);
        let filled: usize = s
            .strip_prefix("ok ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("closeall {mode}: {s}"));
        assert!(filled > 40, "closeall {mode}: only {filled} numbers filled");
        assert_eq!(read_all(&c, &format!("/{mode}/b")).len(), 200_000);
    }
}

/// The calls interposed last, through a C program (tests/c/calls.c):
/// statfs/fstatfs (the pool's numbers, f_type "chfs"), link/linkat (EPERM
/// in the pool as through the mount, EXDEV across, libc's elsewhere),
/// mknod/mknodat (regular files; FIFOs EPERM, mkfifo too), utime/utimes/
/// lutimes/futimes/futimesat, readdir_r, scandir/scandir64 (filter and
/// sort), getdents64 (small buffer, lseek to 0), sendfile both ways (with
/// and without an offset), copy_file_range (offsets and positions),
/// splice through a pipe, and posix_spawnp, system and popen of `cat`
/// while a written file is still open with CHFS_BUF_SIZE (published
/// before the spawn); then
/// `cp` (copy_file_range in coreutils 9) inside the prefix, and `_exit`/
/// `_Exit` without close (published).
#[test]
fn statfs_link_mknod_utimes_scandir_getdents_copies_spawn_exit() {
    calls(&Env::new());
}

fn calls(e: &Env) {
    let c = e.client();
    let exe = e.compile("cc", "calls");
    let local = e.tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let run = |args: &[&str]| e.buffered(exe.to_str().unwrap(), args);
    let out = run(&[&e.m("/c"), local.to_str().unwrap()]);
    assert_eq!(out.stdout, b"ok\n");
    let pat = |n: usize| -> Vec<u8> { (0..n).map(|i| b'A' + (i % 53) as u8).collect() };
    assert!(read_all(&c, "/c/big") == pat(300_000));
    assert!(read_all(&c, "/c/back") == pat(300_000));
    assert!(c.stat("/c/n").unwrap().mode & libc::S_IFMT == libc::S_IFREG);
    assert!(c.stat("/c/g").is_err() && c.stat("/c/p").is_err());

    e.ok("cp", &[&e.m("/c/big"), &e.m("/c/big.cp")]);
    assert!(read_all(&c, "/c/big.cp") == pat(300_000));

    for flag in ["--exit", "--Exit"] {
        let p = format!("/exit{flag}");
        run(&[flag, &e.m(&p)]);
        let got = read_all(&c, &p);
        assert!(got == pat(10_000), "{flag}: {} bytes read back", got.len());
    }
}

/// The interposer over libfabric (`chfsd -p ofi+tcp`, addresses
/// `ofi+tcp://...` in CHFS_SERVER): coreutils (cat, cp, ls, mkdir, mv,
/// md5sum, dd, find, rm), Python's open/listdir/walk/copytree, stdio and a
/// forked child reading on from the parent's descriptor, tar both ways,
/// and an exec publishing what it wrote; each against a fresh pool.
#[test]
fn programs_over_ofi_tcp() {
    if !fabric("programs_over_ofi_tcp") {
        return;
    }
    type Run = fn(&Env);
    let runs: [(&str, Run); 10] = [
        ("coreutils", coreutils),
        ("python", python_open_listdir),
        ("stdio and fork", c_stdio_fork),
        ("tar", tar),
        ("exec", exec_publish),
        ("python subprocess", python_subprocess),
        ("exit without close", exit_publishes),
        ("closing every descriptor", closeall),
        ("calls, spawn, system, popen", calls),
        ("fsx", fsx),
    ];
    for (what, run) in runs {
        eprintln!("over ofi+tcp: {what}");
        run(&Env::over(Some("ofi+tcp")));
    }
}

/// Is the fabric transport built (else skipped, or failed when
/// CHFS_TEST_REQUIRE requires `fabric`)?
fn fabric(test: &str) -> bool {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip("fabric", test, "built without libfabric");
        return false;
    }
    true
}

/// A preloaded program's signals (tests/c/signals.c), over TCP and over
/// ofi+tcp, where the first call into the pool loads libfabric (whose
/// Debian build pulls in a library installing SIGINT/SIGTERM handlers
/// that exit(1)): the program's own SIGTERM handler gets SIGTERM after
/// that call, and SIGINT at its default still kills it by the signal.
#[test]
fn a_preloaded_programs_signal_handlers_stay_its_own() {
    let mut protocols = vec![None];
    if fabric("a_preloaded_programs_signal_handlers_stay_its_own (ofi+tcp)") {
        protocols.push(Some("ofi+tcp"));
    }
    for protocol in protocols {
        let e = Env::over(protocol);
        let c = e.client();
        let exe = e.compile("cc", "signals");
        let out = e
            .cmd(exe.to_str().unwrap())
            .arg(e.m("/sig"))
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            (out.status.signal(), out.stdout.as_slice()),
            (Some(libc::SIGINT), &b"ok\n"[..]),
            "{protocol:?}: {}, stderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(read_all(&c, "/sig"), b"signals");
    }
}
