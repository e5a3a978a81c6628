//! The cache tools (chstagein, chfs) against a real pool with a backend
//! directory.

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use chfs_localpool::LocalPool;

mod common;
use common::{pool_over, rank_totals};

#[test]
fn stagein_from_stdin_then_flush_status_and_wait() {
    stagein_from_stdin_then_flush_status_and_wait_over(None);
}

over_ofi_tcp!(
    stagein_from_stdin_then_flush_status_and_wait_over_ofi_tcp,
    stagein_from_stdin_then_flush_status_and_wait_over
);

fn stagein_from_stdin_then_flush_status_and_wait_over(protocol: Option<&str>) {
    let backend = std::env::temp_dir().join(format!(
        "chfs-ctl-tools-{}{}",
        std::process::id(),
        suffix(protocol)
    ));
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
    let pool = pool_over(2, args, protocol);
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
    // `chfs sync` writes everything back too.
    let fd = c.open("/data/f4", libc::O_WRONLY, 0).unwrap();
    c.pwrite(fd, b"synced", 0).unwrap();
    c.close(fd).unwrap();
    let out = chfs(&["sync"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&fs::read(backend.join("data/f4")).unwrap()[..6], b"synced");
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

/// Is mpirun installed? If not, the test named `test` is skipped (which
/// fails it when the suite requires MPI: `chfs_localpool::skip`).
fn mpirun_here(test: &str) -> bool {
    let has = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        chfs_localpool::skip(
            "mpi",
            test,
            "mpirun not installed (apt install openmpi-bin)",
        );
    }
    has
}

/// `mpirun -n 3 chstagein DIR`: every rank stages its share of the files
/// below DIR, and together they stage all of them once.
#[test]
fn stagein_split_across_mpi_ranks() {
    stagein_split_across_mpi_ranks_over(None);
}

over_ofi_tcp!(
    stagein_split_across_mpi_ranks_over_ofi_tcp,
    stagein_split_across_mpi_ranks_over
);

fn stagein_split_across_mpi_ranks_over(protocol: Option<&str>) {
    if !mpirun_here("stagein_split_across_mpi_ranks") {
        return;
    }
    let backend = std::env::temp_dir().join(format!(
        "chfs-ctl-tools-mpi-{}{}",
        std::process::id(),
        suffix(protocol)
    ));
    let _ = fs::remove_dir_all(&backend);
    let mut total = 0u64;
    for d in 0..3 {
        fs::create_dir_all(backend.join(format!("in/d{d}"))).unwrap();
        for i in 0..10 {
            let len = 5_000 + d * 1000 + i * 37;
            fs::write(backend.join(format!("in/d{d}/f{i}")), vec![i as u8; len]).unwrap();
            total += len as u64;
        }
    }
    let pool = pool_over(
        2,
        vec![
            "--backend".into(),
            backend.display().to_string(),
            "--flush-idle-msec".into(),
            "60000".into(),
        ],
        protocol,
    );
    let list = backend.join("list");
    fs::write(&list, "/in/d0\n/in/d1\n").unwrap();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args(["-x", "CHFS_SERVER"])
        .arg(env!("CARGO_BIN_EXE_chstagein"))
        .args(["-v", "--from"])
        .arg(&list)
        .arg("/in/d2")
        .env("CHFS_SERVER", pool.server_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Each rank reports its share: 30 files split 10/10/10, all bytes once.
    assert_eq!(rank_totals(&err, "chstagein", 3), (30, total), "{err}");
    // Everything is cached: with the backend gone, the data still reads.
    fs::remove_dir_all(backend.join("in")).unwrap();
    let c = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap();
    for d in 0..3 {
        for i in 0..10usize {
            let p = format!("/in/d{d}/f{i}");
            let len = 5_000 + d * 1000 + i * 37;
            let fd = c.open(&p, libc::O_RDONLY, 0).unwrap();
            let mut buf = vec![0u8; len + 10];
            assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), len, "{p}");
            assert!(buf[..len].iter().all(|&b| b == i as u8), "{p}");
            c.close(fd).unwrap();
        }
    }
    drop(pool);
    let _ = fs::remove_dir_all(&backend);
}

/// What names a test's local directories over `protocol` apart from
/// the same test's over TCP (both may run at once).
fn suffix(protocol: Option<&str>) -> String {
    protocol.map(|p| format!("-{p}")).unwrap_or_default()
}

/// A temporary directory removed on drop.
struct TmpDir(std::path::PathBuf);

impl TmpDir {
    fn new(tag: &str) -> TmpDir {
        let p = std::env::temp_dir().join(format!("chfs-ctl-tools-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TmpDir(p.canonicalize().unwrap())
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn client(pool: &LocalPool) -> chfs_client::Client {
    chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap()
}

fn read_pool(c: &chfs_client::Client, p: &str) -> Vec<u8> {
    let st = c.stat(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let fd = c.open(p, libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; st.size as usize + 1];
    let n = c.pread(fd, &mut buf, 0).unwrap();
    c.close(fd).unwrap();
    buf.truncate(n);
    buf
}

/// Every entry below the local directory `local` is in the pool below
/// `dst`, with the same type, permission bits, data and link target.
fn same_tree(c: &chfs_client::Client, local: &std::path::Path, dst: &str) -> usize {
    use std::os::unix::fs::PermissionsExt;
    let mut n = 0;
    for e in fs::read_dir(local).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let (lp, cp) = (e.path(), format!("{dst}/{name}"));
        let md = fs::symlink_metadata(&lp).unwrap();
        let st = c
            .lstat(&cp)
            .unwrap_or_else(|err| panic!("{cp} missing in the pool: {err}"));
        n += 1;
        if md.is_dir() {
            assert!(st.is_dir(), "{cp}");
            assert_eq!(
                st.mode & 0o7777,
                md.permissions().mode() & 0o7777 | 0o700,
                "{cp}"
            );
            n += same_tree(c, &lp, &cp);
        } else if md.file_type().is_symlink() {
            assert!(st.is_symlink(), "{cp}");
            let t = fs::read_link(&lp).unwrap();
            assert_eq!(c.readlink(&cp).unwrap(), t.to_str().unwrap(), "{cp}");
        } else {
            assert!(st.is_file(), "{cp}");
            assert_eq!(st.mode & 0o7777, md.permissions().mode() & 0o7777, "{cp}");
            assert_eq!(read_pool(c, &cp), fs::read(&lp).unwrap(), "{cp}");
        }
    }
    n
}

/// A local tree: files of several sizes (one over a chunk), a nested and
/// an empty directory, an odd mode, a symbolic link.
fn local_tree(root: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(root.join("sub/deeper")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a.dat"), vec![7u8; 300_000]).unwrap();
    fs::write(root.join("sub/b.txt"), b"hello").unwrap();
    fs::write(root.join("sub/deeper/zero"), b"").unwrap();
    for i in 0..12 {
        fs::write(
            root.join(format!("sub/f{i:02}")),
            vec![i as u8; 1000 + i * 97],
        )
        .unwrap();
    }
    fs::set_permissions(root.join("sub/b.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(root.join("sub/deeper"), fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("sub/b.txt", root.join("link")).unwrap();
}

/// Without a backend, `chstagein LOCALFILE` and `chstagein DIR` copy the
/// local file and the whole directory into the pool at the same path (a
/// relative one from the root), as the original's chstagein does and as
/// chfs_stagein() does; running it again is harmless; a path that is
/// neither local nor in the pool is an error naming it.
#[test]
fn stagein_copies_local_files_and_directories_without_a_backend() {
    stagein_copies_local_files_and_directories_without_a_backend_over(None);
}

over_ofi_tcp!(
    stagein_copies_local_files_and_directories_without_a_backend_over_ofi_tcp,
    stagein_copies_local_files_and_directories_without_a_backend_over
);

fn stagein_copies_local_files_and_directories_without_a_backend_over(protocol: Option<&str>) {
    let t = TmpDir::new(&format!("local{}", suffix(protocol)));
    let src = t.0.join("src");
    local_tree(&src);
    let pool = pool_over(2, vec![], protocol);
    let c = client(&pool);
    let run = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chstagein"))
            .args(args)
            .current_dir(dir)
            .env("CHFS_SERVER", pool.server_string())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), err)
    };

    // One local file, by its absolute path: the same path in the pool.
    let file = src.join("a.dat");
    let (code, err) = run(&t.0, &["-v", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("1 paths, 300000 bytes"), "{err}");
    assert_eq!(read_pool(&c, file.to_str().unwrap()), vec![7u8; 300_000]);

    // A directory, by a relative path: "src" is /src in the pool, with
    // everything below it.
    let (code, err) = run(&t.0, &["-v", "src"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(same_tree(&c, &src, "/src"), 19);
    // Again (what is there is overwritten), and from standard input as
    // `find src | chstagein`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_chstagein"))
        .current_dir(&t.0)
        .env("CHFS_SERVER", pool.server_string())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let find = Command::new("find")
        .arg("src")
        .current_dir(&t.0)
        .output()
        .unwrap();
    child.stdin.take().unwrap().write_all(&find.stdout).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(same_tree(&c, &src, "/src"), 19);

    // Neither here nor in the pool (and no backend): ENOENT, named.
    let (code, err) = run(&t.0, &["no-such-file"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("no-such-file") && err.contains("no backend"),
        "{err}"
    );
    // The library call is the same rule.
    assert_eq!(
        c.stagein(src.join("sub/b.txt").to_str().unwrap()).unwrap(),
        5
    );
}

/// `chfs stagein` is chstagein: a local directory is copied in, with the
/// same options, and by the same rank rule (the rank variables mpirun
/// sets, taken as they are with CHFS_MPI=1: each of three processes
/// stages its share, together all of it once).
#[test]
fn chfs_stagein_copies_a_local_directory_as_chstagein_does() {
    chfs_stagein_copies_a_local_directory_as_chstagein_does_over(None);
}

over_ofi_tcp!(
    chfs_stagein_copies_a_local_directory_as_chstagein_does_over_ofi_tcp,
    chfs_stagein_copies_a_local_directory_as_chstagein_does_over
);

fn chfs_stagein_copies_a_local_directory_as_chstagein_does_over(protocol: Option<&str>) {
    let t = TmpDir::new(&format!("chfs-stagein{}", suffix(protocol)));
    let (src, ranked) = (t.0.join("src"), t.0.join("ranked"));
    local_tree(&src);
    local_tree(&ranked);
    let pool = pool_over(2, vec![], protocol);
    let chfs = |dir: &str, env: &[(&str, String)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chfs"))
            .args(["stagein", "-v", dir])
            .current_dir(&t.0)
            .env("CHFS_SERVER", pool.server_string())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let err = chfs("src", &[("CHFS_MPI", "0".into())]);
    assert!(err.starts_with("chfs: 1 paths, "), "{err}");
    let c = client(&pool);
    assert_eq!(same_tree(&c, &src, "/src"), 19);
    let mut err = String::new();
    for r in 0..3 {
        err += &chfs(
            "ranked",
            &[
                ("CHFS_MPI", "1".into()),
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "3".into()),
            ],
        );
    }
    let total: u64 = 300_000 + 5 + (0..12).map(|i| 1000 + i * 97).sum::<u64>();
    assert_eq!(rank_totals(&err, "chfs", 3), (20, total), "{err}");
    assert_eq!(same_tree(&c, &ranked, "/ranked"), 19);
}

/// `mpirun -n 3 chstagein DIR` of a local directory: the ranks share its
/// entries out and together copy all of it once.
#[test]
fn local_directory_split_across_mpi_ranks() {
    local_directory_split_across_mpi_ranks_over(None);
}

over_ofi_tcp!(
    local_directory_split_across_mpi_ranks_over_ofi_tcp,
    local_directory_split_across_mpi_ranks_over
);

fn local_directory_split_across_mpi_ranks_over(protocol: Option<&str>) {
    if !mpirun_here("local_directory_split_across_mpi_ranks") {
        return;
    }
    let t = TmpDir::new(&format!("local-mpi{}", suffix(protocol)));
    let src = t.0.join("src");
    local_tree(&src);
    let pool = pool_over(2, vec![], protocol);
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args(["-x", "CHFS_SERVER"])
        .arg(env!("CARGO_BIN_EXE_chstagein"))
        .args(["-v", "src"])
        .current_dir(&t.0)
        .env("CHFS_SERVER", pool.server_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // 20 items (the directory and the 19 entries below it), each once.
    let total: u64 = 300_000 + 5 + (0..12).map(|i| 1000 + i * 97).sum::<u64>();
    assert_eq!(rank_totals(&err, "chstagein", 3), (20, total), "{err}");
    assert_eq!(same_tree(&client(&pool), &src, "/src"), 19);
}

/// Cache mode: a local path inside the backend directory (absolute, or
/// relative from a directory of the backend: the original's `cd BACKEND;
/// find . | xargs chstagein`) is fetched by the servers as the same path of
/// the pool, not copied: it is clean (nothing to write back) and the
/// backend file is not touched.
#[test]
fn local_paths_inside_the_backend_are_fetched_not_copied() {
    let t = TmpDir::new("inback");
    let backend = t.0.join("backend");
    fs::create_dir_all(backend.join("in/sub")).unwrap();
    fs::write(backend.join("in/big"), vec![3u8; 200_000]).unwrap();
    fs::write(backend.join("in/sub/small"), b"small").unwrap();
    let mtime = |p: &str| fs::metadata(backend.join(p)).unwrap().modified().unwrap();
    let before = (mtime("in/big"), mtime("in/sub/small"));
    let pool = pool_over(
        2,
        vec![
            "--backend".into(),
            backend.display().to_string(),
            "--flush-idle-msec".into(),
            "50".into(),
        ],
        None,
    );
    let run = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chstagein"))
            .args(args)
            .current_dir(dir)
            .env("CHFS_SERVER", pool.server_string())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        err
    };
    let big = backend.join("in/big");
    let err = run(&t.0, &["-v", big.to_str().unwrap()]);
    assert!(err.contains("200000 bytes"), "{err}");
    let err = run(&backend.join("in"), &["-v", "sub"]);
    assert!(err.contains("5 bytes"), "{err}");
    let c = client(&pool);
    // Nothing dirty: the servers fetched the files, nobody wrote them.
    let s = c.flush_status("/").unwrap();
    assert_eq!((s.chunks, s.bytes), (0, 0), "{s:?}");
    // No copy at the local path's name in the pool.
    assert_eq!(
        c.lstat(big.to_str().unwrap()).unwrap_err().errno(),
        libc::ENOENT
    );
    // Cached: with the backend gone, the data reads.
    let moved = t.0.join("moved");
    fs::rename(&backend, &moved).unwrap();
    fs::create_dir_all(&backend).unwrap();
    assert_eq!(read_pool(&c, "/in/big"), vec![3u8; 200_000]);
    assert_eq!(read_pool(&c, "/in/sub/small"), b"small");
    fs::remove_dir_all(&backend).unwrap();
    fs::rename(&moved, &backend).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(before, (mtime("in/big"), mtime("in/sub/small")));
    drop(pool);
}

/// The client settings table is the one source of their documentation:
/// every setting is in the tools' `--help` and in README.md's table.
#[test]
fn every_client_setting_is_in_the_tools_help_and_the_readme() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    for bin in [
        env!("CARGO_BIN_EXE_chfs"),
        env!("CARGO_BIN_EXE_chlist"),
        env!("CARGO_BIN_EXE_chmkdir"),
        env!("CARGO_BIN_EXE_chrmdir"),
        env!("CARGO_BIN_EXE_chstagein"),
    ] {
        let out = std::process::Command::new(bin)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{bin} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        for s in chfs_client::config::SETTINGS {
            assert!(help.contains(s.env), "{bin} --help lacks {}", s.env);
        }
    }
    for s in chfs_client::config::SETTINGS {
        assert!(
            readme.contains(&format!("`{}`", s.env)),
            "README.md lacks {}",
            s.env
        );
    }
}

/// `chfs df`: the pool's use, with the node-local areas apart (every
/// node's, and this node's: here every server is on this host, the first
/// keeps the area).
#[test]
fn chfs_df_shows_the_node_local_area_apart() {
    chfs_df_shows_the_node_local_area_apart_over(None);
}

over_ofi_tcp!(
    chfs_df_shows_the_node_local_area_apart_over_ofi_tcp,
    chfs_df_shows_the_node_local_area_apart_over
);

fn chfs_df_shows_the_node_local_area_apart_over(protocol: Option<&str>) {
    let pool = pool_over(2, vec![], protocol);
    let c = client(&pool);
    for (f, n) in [("/.nodelocal/scratch", 5000), ("/shared", 7000)] {
        let fd = c.create(f, chfs_client::flags::O_WRONLY, 0o644).unwrap();
        c.pwrite(fd, &vec![1u8; n], 0).unwrap();
        c.close(fd).unwrap();
    }
    let df = |env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_chfs"))
            .arg("df")
            .env("CHFS_SERVER", pool.server_string())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let out = df(&[]);
    assert!(out.starts_with("pool: 2 servers, "), "{out}");
    assert!(
        out.contains("node-local areas (every node, counted in the pool): 5000 bytes in 1 entries"),
        "{out}"
    );
    assert!(
        out.contains("this node's area (/.nodelocal): 5000 bytes in 1 entries"),
        "{out}"
    );
    let out = df(&[("CHFS_NODE_LOCAL_PREFIX", "")]);
    assert!(out.contains("this node's area: off"), "{out}");
}
